"""A worker killed mid-run or while idle: the failure names the worker (and no transport internals),
every request ends, new requests are refused, nothing hangs.

Through the coordinator (every request of the offline API ends with the failure), and through the
HTTP server: /health turns 503 within 5 s even with no traffic, in-flight requests end with a 503
naming the worker, new requests get the same 503."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from minisgl.afd.args import AfdArgs
from minisgl.afd.coordinator import Coordinator
from minisgl.afd.worker_group import WorkerFailure
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest
from server_harness import SERVER_FLAGS, Server, kill_mid_run, running_server

DETECT_S = 5.0  # /health must turn 503 within this
AFD_FLAGS = ("--afd", "--afd-attn-workers", "2", "--afd-expert-workers", "2", "--afd-num-mb", "2")
TRANSPORT_WORDS = ("gloo", "127.0.0.1", "Connection", "tcp://", "Traceback")


@pytest.mark.parametrize("victim,pause", [("expert0", 0.0), ("attn1", 0.0), ("expert0", 1.0)])
def test_killed_worker_fails_in_flight_requests(tiny_checkpoints, victim: str, pause: float) -> None:
    """pause: time between the kill and the next step, so the coordinator's next plan goes to a
    socket whose peer is already gone (a send that must fail, not block)."""
    args = EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", dtype="float32", context_length=512)
    coord = Coordinator(resolve_plan(args), AfdArgs(attn_workers=2, expert_workers=1, num_mb=2, step_timeout_s=30))
    try:
        params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        for i in range(4):
            coord.add_request(GenerateRequest(f"r{i}", (1, 2, 3, 4 + i), params))
        for _ in range(3):
            coord.step()
        coord.workers.launcher.procs[victim].kill()
        time.sleep(pause)
        start = time.monotonic()
        with pytest.raises(WorkerFailure) as failure:
            while coord.has_work and time.monotonic() - start < 10:
                coord.step()
        assert time.monotonic() - start < 10
        message = str(failure.value)
        assert f"worker {victim} (pid " in message and "killed by signal 9" in message, message
        assert not any(w in message for w in TRANSPORT_WORDS), message
        assert not coord.has_work, "every request ended with the failure"
        with pytest.raises(RuntimeError, match="AFD workers failed"):
            coord.add_request(GenerateRequest("late", (1, 2), params))
        coord.check_integrity()  # every page and slot is back
    finally:
        coord.close()


def test_idle_coordinator_reports_a_dead_worker(tiny_checkpoints) -> None:
    args = EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", dtype="float32", context_length=512)
    coord = Coordinator(resolve_plan(args), AfdArgs(attn_workers=1, expert_workers=2, step_timeout_s=30))
    try:
        assert not coord.has_work
        coord.workers.launcher.procs["expert1"].kill()
        coord.workers.launcher.procs["expert1"].join(5)
        assert coord.has_work, "a death is something to report"
        with pytest.raises(WorkerFailure, match="worker expert1 .* killed by signal 9"):
            coord.step()
        assert not coord.has_work
    finally:
        coord.close()


def _worker_pid(server: Server, name: str) -> int:
    """A worker of this server by the process name it gives itself (minisgl-expert0, ...)."""
    engine = server.get("/server_info").json()["engine_pid"]
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == f"minisgl-{name}" and _ppid(int(comm.parent.name)) == engine:
                return int(comm.parent.name)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no process minisgl-{name} under the engine (pid {engine})")


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _health_503_within(server: Server, limit_s: float) -> tuple[float, str]:
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        r = server.get("/health")
        if r.status_code == 503:
            return time.monotonic() - start, r.json()["error"]["message"]
        time.sleep(0.05)
    raise AssertionError(f"/health still {r.status_code} {limit_s} s after the kill\n{server.log_tail()}")


def _assert_names_the_worker(message: str, victim: str) -> None:
    assert f"AFD worker {victim} (pid " in message and "killed by signal 9" in message, message
    assert not any(w in message for w in TRANSPORT_WORDS), message


@pytest.mark.load
def test_server_reports_an_idle_dead_worker(tmp_path, _isolated_cache) -> None:
    with running_server(tmp_path, *SERVER_FLAGS, *AFD_FLAGS) as server:
        assert server.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4}).status_code == 200
        server.wait_idle()
        os.kill(_worker_pid(server, "expert1"), signal.SIGKILL)
        took, message = _health_503_within(server, DETECT_S)
        _assert_names_the_worker(message, "expert1")
        r = server.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        assert r.status_code == 503, r.text
        _assert_names_the_worker(r.json()["error"]["message"], "expert1")
        print(f"\nidle expert1 killed: /health 503 after {took:.2f} s")


@pytest.mark.load
def test_server_fails_in_flight_requests_of_a_dead_worker(tmp_path, _isolated_cache) -> None:
    with running_server(tmp_path, *SERVER_FLAGS, *AFD_FLAGS) as server:
        start = time.monotonic()
        killed = asyncio.run(kill_mid_run(server.url, _worker_pid(server, "expert0"), 30, streams=6, posts=4))
        ended = time.monotonic() - start
        for last in killed.streams:
            err = json.loads(last)["error"]
            assert err["code"] == 503, err
            _assert_names_the_worker(err["message"], "expert0")
        for r in [*killed.posts, killed.after]:
            assert r.status_code == 503, r.text
            _assert_names_the_worker(r.json()["error"]["message"], "expert0")
        took, message = _health_503_within(server, DETECT_S)
        _assert_names_the_worker(message, "expert0")
        print(f"\nbusy expert0 killed: every in-flight request ended, the kill included, within {ended:.2f} s")
