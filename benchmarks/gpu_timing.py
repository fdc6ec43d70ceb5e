"""Timing helpers shared by bench_moe.py and bench_decode.py: median device times and the copy
bandwidth that every figure is a ratio of, measured in the same process."""
from __future__ import annotations

from collections.abc import Callable

import torch


def median_us(fn: Callable[[], object], warmup_ms: int = 10, rep_ms: int = 50) -> float:
    """Median of triton's do_bench (events; L2 flushed between runs), in microseconds."""
    from triton.testing import do_bench  # here, so table() serves CPU-only scripts too

    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3


def graph_us(calls: list[Callable[[], object]], warmup_ms: int = 10, rep_ms: int = 50) -> float:
    """Median device time of one call, with `calls` captured back to back in one CUDA graph, as a
    decode step replays them: no host launch cost. Give calls over distinct operands whose bytes
    together exceed the L2 (50 MB on an H200), so each call reads its operands from HBM, as each
    layer does in decode."""
    for call in calls:  # compile and allocate outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return median_us(graph.replay, warmup_ms, rep_ms) / len(calls)


def copy_tbps() -> float:
    """Device-to-device copy of 2 GiB, read + write bytes counted, in TB/s."""
    src = torch.randn(1 << 29, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.nbytes / median_us(lambda: dst.copy_(src)) / 1e6


def table(rows: list[dict[str, object]], title: str) -> str:
    """A markdown table of rows (dicts; a key a row lacks shows as '-'), floats to 3 significant digits."""
    if not rows:
        return f"{title}: (no rows)"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cell = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"### {title}", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(r.get(k, "-")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)
