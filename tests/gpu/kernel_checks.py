"""Helpers shared by the GPU kernel tests: error metric, poisoned outputs, random pool slots."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

DEVICE = "cuda"
# max|x - ref| / max|ref|. fp32 math lands near 1e-6; bf16 outputs carry bf16 rounding (2^-9 relative).
TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2}


def rel_err(x: Tensor, ref: Tensor) -> float:
    return ((x.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def assert_close(x: Tensor, ref: Tensor, tol: float, what: str) -> None:
    assert not x.isnan().any(), f"{what}: NaN left in the output (an element was never written)"
    err = rel_err(x, ref)
    assert err <= tol, f"{what}: rel err {err:.2e} > {tol:.0e}"


def poisoned(*shape: int, dtype: torch.dtype) -> Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def random_slots(count: int, num_slots: int) -> Tensor:
    """`count` distinct real slots in [1, num_slots], in random order."""
    return (torch.randperm(num_slots, device=DEVICE)[:count] + 1).to(torch.int64)


def others(slots: Tensor, total: int) -> Tensor:
    """Pool indices in [0, total) that `slots` does not name (slot 0 included)."""
    keep = torch.ones(total, dtype=torch.bool, device=slots.device)
    keep[slots] = False
    return keep.nonzero()[:, 0]


def captured(run: Callable[[], Tensor]) -> tuple[torch.cuda.CUDAGraph, Tensor]:
    """run() once on a side stream (its kernels compile outside capture), then captured into a CUDA
    graph: (the graph, the output buffer its replays write)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out
