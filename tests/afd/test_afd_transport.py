"""The M2N/N2M exchange between two gloo processes: exact in the model dtype; FP8 e4m3 with per-token
128-wide group scales within the format's rounding, and expert outputs close to the exact ones."""
from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minisgl.afd.transport import Transport
from minisgl.moe.torch_experts import TorchExperts

H, K, BUCKET, T = 256, 2, 8, 5


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    # Rows of very different scales: per-token scales must keep small rows accurate.
    x = torch.randn(T, H, generator=g) * torch.logspace(-3, 2, T)[:, None]
    ids = torch.randint(0, 4, (T, K), generator=g, dtype=torch.int32)
    w = torch.rand(T, K, generator=g)
    return x, ids, w


def _run(rank: int, port: int, fp8: bool, out_dir: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30))
    tr = Transport(rank, 1, 1, H, K, torch.float32, fp8, torch.device("cpu"))
    x, ids, w = _inputs()
    if rank == 0:
        got = tr.combine(tr.dispatch(0, BUCKET, x, ids, w))
        torch.save(got, os.path.join(out_dir, "combined.pt"))
    else:
        hidden, rids, rw = tr.receive(tr.post_receive(0, BUCKET))
        torch.save((rids, rw), os.path.join(out_dir, "routing.pt"))
        for work in tr.send_combine(0, BUCKET, hidden):  # echo the received rows back
            work.wait()
    dist.destroy_process_group()


def _exchange(fp8: bool, tmp_path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.start_processes(_run, args=(store.port, fp8, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    ids, w = torch.load(tmp_path / "routing.pt")
    return torch.load(tmp_path / "combined.pt"), ids, w


def test_model_dtype_dispatch_is_exact(tmp_path) -> None:
    x, ids, w = _inputs()
    got, rids, rw = _exchange(False, tmp_path)
    assert torch.equal(got, x)
    assert torch.equal(rids[:T], ids.long()) and bool((rids[T:] == -1).all())  # padding routes nowhere
    assert torch.equal(rw[:T], w) and not rw[T:].any()


def test_fp8_dispatch_within_e4m3_rounding(tmp_path) -> None:
    x, ids, w = _inputs()
    got, _, _ = _exchange(True, tmp_path)
    # e4m3 keeps 3 mantissa bits: a normal value rounds within 2^-4 of itself. Values far below their
    # group's max fall into subnormals, whose spacing is 2^-9 of the group scale (amax / 448).
    amax = x.abs().view(T, -1, 128).amax(-1, keepdim=True).expand(-1, -1, 128).reshape(T, H)
    bound = x.abs() / 16 + amax / 448 * 2**-9
    assert bool(((got - x).abs() <= bound).all())
    # Expert outputs computed from the FP8-dispatched rows stay close to the exact ones.
    g = torch.Generator().manual_seed(6)
    w13 = torch.randn(4, 2 * 64, H, generator=g) / H**0.5
    w2 = torch.randn(4, H, 64, generator=g) / 64**0.5
    experts = TorchExperts()
    ref = experts.forward(x, w13, w2, ids.long(), w)
    fp8 = experts.forward(got, w13, w2, ids.long(), w)
    rel = ((fp8 - ref).norm(dim=-1) / ref.norm(dim=-1)).max()
    assert rel < 0.06, float(rel)  # per-row, well inside the 2^-4 element bound


def test_fp8_dispatch_needs_whole_groups() -> None:
    with pytest.raises(ValueError, match="hidden_size % 128"):
        Transport(0, 1, 1, 100, 2, torch.float32, True, torch.device("cpu"))
