"""Kill the engine (or the detokenizer) under load: in-flight requests get errors, new requests get a
503 with the reason, the gauges stop reporting requests that no longer run, the surviving child is
stopped rather than left running orphaned requests, and nothing hangs (each scenario is bounded by
DEATH_TIMEOUT)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from server_harness import KILL_BODY, SERVER_FLAGS, kill_mid_run, running_server

DEATH_TIMEOUT = 20.0


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.load
def test_engine_killed_under_load(tmp_path, _isolated_cache) -> None:
    with running_server(tmp_path, *SERVER_FLAGS) as server:
        pid = server.get("/server_info").json()["engine_pid"]
        start = time.monotonic()
        killed = asyncio.run(kill_mid_run(server.url, pid, DEATH_TIMEOUT))
        assert time.monotonic() - start < DEATH_TIMEOUT
        for last in killed.streams:
            err = json.loads(last)["error"]
            assert err["code"] == 503 and "engine process was killed by signal 9" in err["message"], err
        for r in killed.posts:
            assert r.status_code == 503 and "killed by signal 9" in r.json()["error"]["message"], r.text
        assert killed.after.status_code == 503 and "killed by signal 9" in killed.after.json()["error"]["message"]
        health = server.get("/health")
        assert health.status_code == 503 and "engine" in health.json()["error"]["message"]
        assert server.get("/server_info").json()["dead_reason"]
        assert server.proc.poll() is None, "the API server stays up to report the failure"
        assert server.gauges() == {"minisgl:num_running_reqs": 0.0, "minisgl:num_queue_reqs": 0.0}
        assert server.get("/server_info").json()["stats"] is None


@pytest.mark.load
def test_detokenizer_killed_under_load(tmp_path, _isolated_cache) -> None:
    """Without its detokenizer the engine's work reaches nobody: it is stopped, not left running."""
    with running_server(tmp_path, *SERVER_FLAGS) as server:
        info = server.get("/server_info").json()
        engine, detokenizer = info["engine_pid"], info["detokenizer_pid"]
        start = time.monotonic()
        killed = asyncio.run(kill_mid_run(server.url, detokenizer, DEATH_TIMEOUT))
        assert time.monotonic() - start < DEATH_TIMEOUT
        for last in killed.streams:
            assert "detokenizer process was killed by signal 9" in json.loads(last)["error"]["message"], last
        assert all(r.status_code == 503 for r in killed.posts) and killed.after.status_code == 503
        deadline = time.monotonic() + 5
        while _running(engine) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(engine), "the engine keeps running requests nobody can receive"
        assert server.get("/health").status_code == 503
        assert server.gauges() == {"minisgl:num_running_reqs": 0.0, "minisgl:num_queue_reqs": 0.0}


@pytest.mark.load
def test_hung_engine_is_stopped_by_the_watchdog(tmp_path, _isolated_cache) -> None:
    """A frozen engine (SIGSTOP) keeps its process alive, so only the missing heartbeat shows it."""
    with running_server(tmp_path, *SERVER_FLAGS, "--watchdog-timeout", "3") as server:
        pid = server.get("/server_info").json()["engine_pid"]
        with httpx.Client(base_url=server.url, timeout=DEATH_TIMEOUT) as client:
            with client.stream("POST", "/v1/completions", json={**KILL_BODY, "stream": True}) as r:
                lines = r.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                os.kill(pid, signal.SIGSTOP)
                start = time.monotonic()
                last = [line for line in lines if line.startswith("data: ") and line != "data: [DONE]"][-1]
            waited = time.monotonic() - start
        assert waited < DEATH_TIMEOUT
        assert "no progress" in json.loads(last[6:])["error"]["message"]
        assert server.post("/v1/completions", json={**KILL_BODY, "max_tokens": 2}).status_code == 503
