"""benchmarks/prefill_idle.py's reading of a profiler trace, on the CPU: idle is the time in no
kernel (overlaps counted once), a gap is late when its kernel's launch began after the device ran
dry, and each gap goes to the innermost CPU op around that launch."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

from prefill_idle import idle_between_kernels, report  # noqa: E402


def _kernel(name: str, ts: float, dur: float, corr: int, cat: str = "kernel") -> dict:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def _launch(ts: float, corr: int, cat: str = "cuda_runtime") -> dict:
    return {"cat": cat, "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "args": {"correlation": corr}}


def test_idle_gaps_lateness_and_launching_ops() -> None:
    events = [
        _kernel("a", 0, 10, 1), _launch(0, 1),
        _kernel("b", 15, 10, 2), _launch(12, 2, "cuda_driver"),  # launched after a ended: 5 late
        _kernel("c", 27, 3, 3), _launch(5, 3),  # launched early: a 2 us boundary, not late
        _kernel("d", 30, 10, 4, "gpu_memcpy"), _launch(6, 4),  # back to back: no gap
        _kernel("e", 35, 15, 5), _launch(7, 5),  # overlaps d: no gap, counted once
        _kernel("f", 52, 4, 6, "gpu_memset"), _launch(51, 6),  # 2 us idle; its launch came late too
        {"cat": "cpu_op", "name": "outer", "ts": 0, "dur": 100},
        {"cat": "cpu_op", "name": "inner", "ts": 11, "dur": 3},
        {"cat": "python_function", "name": "ignored", "ts": 0, "dur": 100},
    ]
    r = idle_between_kernels(events)
    assert (r.span, r.idle, r.late, r.kernels) == (56, 9, 7, 6)
    assert dict(r.by_op) == {"inner -> b": 5, "outer -> c": 2, "outer -> f": 2}
    assert [(g, before, after, late) for g, before, after, _, late in r.gaps] == [
        (5, "a", "b", True), (2, "b", "c", False), (2, "e", "f", True)]
    assert "idle 0.0 ms (16.1%) over 6 kernels" in report(r)
