"""A worker killed mid-run: every in-flight request ends with an error naming the worker, within
10 s; new requests are refused; nothing hangs."""
from __future__ import annotations

import time

import pytest

from minisgl.afd.args import AfdArgs
from minisgl.afd.coordinator import Coordinator
from minisgl.engine.args import EngineArgs
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.io import GenerateRequest


@pytest.mark.parametrize("victim,pause", [("expert0", 0.0), ("attn1", 0.0), ("expert0", 1.0)])
def test_killed_worker_fails_in_flight_requests(tiny_checkpoints, victim: str, pause: float) -> None:
    """pause: time between the kill and the next step, so the coordinator's next plan goes to a
    socket whose peer is already gone (a send that must fail, not block)."""
    args = EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", dtype="float32", context_length=512)
    coord = Coordinator(args, AfdArgs(attn_workers=2, expert_workers=1, num_mb=2, step_timeout_s=30))
    try:
        params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        for i in range(4):
            coord.add_request(GenerateRequest(f"r{i}", (1, 2, 3, 4 + i), params))
        for _ in range(3):
            coord.step()
        coord.launcher.procs[victim].kill()
        time.sleep(pause)
        start = time.monotonic()
        errors = {}
        while coord.has_work and time.monotonic() - start < 10:
            for out in coord.step():
                if out.error:
                    errors[out.rid] = out.error
        assert time.monotonic() - start < 10
        assert set(errors) == {f"r{i}" for i in range(4)}
        assert all(victim in e for e in errors.values()), errors
        with pytest.raises(RuntimeError, match="AFD workers failed"):
            coord.add_request(GenerateRequest("late", (1, 2), params))
        coord.check_integrity()
    finally:
        coord.close()
