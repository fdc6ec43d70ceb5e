"""Device-side flags that order two processes' (or two streams') work without the host: a sender
raises a counter with a release atomic at system scope, a receiver's one-warp kernel spins on it
with volatile loads, then acquires. The streams that launched them stay ordered as usual, so a copy
issued before `signal` is visible to every read issued after the peer's `wait`. Both counters live
on the device, so the calls can be captured in a CUDA graph and replayed: each replay raises the
flag to a new value and waits for a new one.

Every wait is bounded by a %globaltimer deadline. One that runs out never hangs: it writes its
channel (+1) into the caller's error word and returns, and later waits with the error word set
return at once, so a dead peer costs one deadline. The host reads the error word where it already
synchronises (afd/ipc_transport.py).

These are the kernels benchmarks/afd_ipc_probe.py measured on an H200 (a release atomic, volatile
polling, an acquire atomic after the spin).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

FLAG_SLOT = 4  # int32s per flag: each flag 16-byte aligned, as Triton specialises on pointer alignment


@triton.jit
def globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def signal_kernel(flag_ptr):
    tl.atomic_add(flag_ptr, 1, sem="release", scope="sys")


@triton.jit(do_not_specialize=["channel", "timeout_ns"])
def wait_kernel(flag_ptr, count_ptr, error_ptr, channel, timeout_ns):
    # The receiver's own count of messages on this channel: the flag must reach it + 1.
    expected = tl.load(count_ptr) + 1
    tl.store(count_ptr, expected)
    failed = tl.load(error_ptr, volatile=True)
    seen = tl.load(flag_ptr, volatile=True)
    start = globaltimer()
    waited = start - start
    while (seen < expected) & (failed == 0) & (waited < timeout_ns):
        seen = tl.load(flag_ptr, volatile=True)
        waited = globaltimer() - start
    # Acquire: the reads that follow this kernel see what the peer wrote before its release. Its
    # result is used, or the compiler drops an atomic add of 0 (it did in the probe's kernel).
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    if (seen < expected) & (failed == 0):
        tl.store(error_ptr, channel + 1)


def signal(flag: torch.Tensor) -> None:
    """Raise `flag` (an int32 slot, possibly mapped from another process) by one."""
    signal_kernel[(1,)](flag, num_warps=1)


def wait(flag: torch.Tensor, count: torch.Tensor, error: torch.Tensor, channel: int, timeout_ns: int) -> None:
    """Block this stream until `flag` exceeds `count` (then count += 1), or record `channel` + 1 in
    `error` after timeout_ns."""
    wait_kernel[(1,)](flag, count, error, channel, timeout_ns, num_warps=1)
