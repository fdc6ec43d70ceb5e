"""Killing an AFD worker mid-decode and checking what the coordinator does about it, for the GPU
tests (tests/gpu/test_afd_ipc.py eagerly, tests/gpu/test_afd_graphs.py during graph replay)."""
from __future__ import annotations

import time

import pytest

from minisgl.afd.coordinator import Coordinator
from minisgl.afd.worker_group import WorkerFailure

FAILURE_WITHIN_S = 10.0


def kill_and_expect_every_request_failed(coord: Coordinator, victim: str) -> str:
    """Kill `victim` (SIGKILL) while requests are in flight: stepping on must raise WorkerFailure
    naming it within FAILURE_WITHIN_S, end every request, and give every page and slot back.
    Returns a line saying how long it took."""
    coord.workers.launcher.procs[victim].kill()
    start = time.monotonic()
    with pytest.raises(WorkerFailure) as failure:
        while coord.has_work and time.monotonic() - start < FAILURE_WITHIN_S:
            coord.step()
    took = time.monotonic() - start
    assert took < FAILURE_WITHIN_S, took
    message = str(failure.value)
    assert f"worker {victim} (pid " in message and "killed by signal 9" in message, message
    assert not coord.has_work, "every request ended with the failure"
    coord.check_integrity()  # every page and slot is back
    return f"{victim} killed: failure after {took:.2f} s: {message}"
