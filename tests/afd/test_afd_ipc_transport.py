"""IpcTransport between 2 attention lanes and 2 expert workers, on the CPU. Host shared memory
stands in for CUDA IPC and a host spin for the flag kernels (the three methods the class keeps for
what is CUDA's); the rest is the transport's own: an inbox per (micro-batch, sender) sized for the
largest bucket, a flag and a count per channel, the peers' mapping, buffers reused across layers,
micro-batches and buckets without acknowledgements, FP8 dispatch, and a wait that runs out raising
through check() with the peer's name. (The CUDA path: tests/gpu/test_afd_ipc.py.)"""
from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler

from ipc_exchange_rounds import (
    attention_check, attention_round, expert_check, expert_round, message, run_ranks, H, K,
)
from minisgl.afd.ipc_transport import IpcTransport

AGS, EGS, NUM_MB, LAYERS, BUCKETS = 2, 2, 2, 3, (1, 4, 8)
JOIN_S = 120.0


class HostFlags:
    """kernels/device_flags.py's contract on the host: raise by one; wait until the flag exceeds the
    count (then count it), or record channel + 1 in the error word at the deadline; once the error
    word is set, return at once."""

    FLAG_SLOT = 4

    @staticmethod
    def signal(flag: torch.Tensor) -> None:
        flag.add_(1)

    @staticmethod
    def wait(flag: torch.Tensor, count: torch.Tensor, error: torch.Tensor, channel: int, timeout_ns: int) -> None:
        count.add_(1)
        if int(error[0]):
            return
        deadline = time.monotonic() + timeout_ns / 1e9
        while int(flag[0]) < int(count[0]):
            if time.monotonic() > deadline:
                error[0] = channel + 1
                return
            time.sleep(1e-4)


class HostIpcTransport(IpcTransport):
    def _flag_kernels(self):
        return HostFlags

    @staticmethod
    def _export(t: torch.Tensor) -> object:
        return bytes(ForkingPickler.dumps(t))  # moves t into shared memory, named by a file

    @staticmethod
    def _import(handle: object) -> torch.Tensor:
        return ForkingPickler.loads(handle)


def _rank(rank: int, results, fp8: bool) -> None:
    mp.set_sharing_strategy("file_system")  # a handle that pickles as a name, through gloo
    torch.set_num_threads(1)
    dtype, dev = torch.float32, "cpu"
    tr = HostIpcTransport(rank, AGS, EGS, H, K, dtype, fp8, torch.device(dev), num_mb=NUM_MB,
                          max_bucket=max(BUCKETS), timeout_s=60.0)
    rounds = [(b, layer) for b in BUCKETS for layer in range(LAYERS)]
    if rank < AGS:
        inputs = {(b, layer, mb): message(b, layer, mb, rank, 0, dtype, dev)
                  for b, layer in rounds for mb in range(NUM_MB)}
        outs: dict = {}
        for b, layer in rounds:
            outs |= attention_round(tr, inputs, b, layer, NUM_MB)
        attention_check(outs, rank, 0, EGS, dtype, fp8, dev)
    else:
        seen: dict = {}
        for b, layer in rounds:
            seen |= expert_round(tr, b, layer, NUM_MB, rank - AGS)
        expert_check(seen, rank - AGS, 0, AGS, dtype, fp8, dev)
    tr.check()
    results.put((rank, "rounds", len(rounds) * NUM_MB))
    if rank == 0:  # a combine that never comes (the expert workers are done): no hang, the peer named
        tr.timeout_s = 0.5
        start = time.monotonic()
        tr.combine(tr.dispatch(0, 1, *message(1, 0, 0, 0, 99, dtype, dev)))
        took = time.monotonic() - start
        try:
            tr.check()
        except RuntimeError as e:
            results.put((rank, "timeout", (round(took, 2), str(e))))
        else:
            raise AssertionError("check() raised nothing after a combine that never came")


@pytest.mark.parametrize("fp8", [False, True], ids=["fp32", "fp8"])
def test_two_by_two_exchange_through_shared_inboxes(fp8: bool) -> None:
    notes = run_ranks(_rank, (fp8,), AGS + EGS, JOIN_S)
    assert sorted(r for r, kind, _ in notes if kind == "rounds") == list(range(AGS + EGS)), notes
    [(took, message_)] = [v for _, kind, v in notes if kind == "timeout"]
    assert "the combine of expert worker 0 (rank 2) for micro-batch 0 did not arrive within 0.5 s" in message_, message_
    assert 0.4 < took < 5, took


def test_a_bucket_beyond_the_buffers_is_refused() -> None:
    notes = run_ranks(_oversized, (), 2, JOIN_S)
    assert ("refused", "dispatch bucket 16 exceeds the largest this transport was sized for (8)") in [
        (kind, v) for _, kind, v in notes], notes


def _oversized(rank: int, results) -> None:
    mp.set_sharing_strategy("file_system")
    tr = HostIpcTransport(rank, 1, 1, H, K, torch.float32, False, torch.device("cpu"), num_mb=1, max_bucket=8,
                          timeout_s=1.0)
    try:
        if rank == 0:
            tr.dispatch(0, 16, *message(16, 0, 0, 0, 0, torch.float32, "cpu"))
        else:
            tr.post_receive(0, 16)
    except ValueError as e:
        results.put((rank, "refused", str(e)))
