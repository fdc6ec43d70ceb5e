"""Start `python -m minisgl serve` on a free loopback port for tests, and always stop it.

Registered as a pytest plugin (conftest.py), so the session shares one server: `live_server`.
Every wait here is bounded; a server that does not come up fails the test with its log.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

STARTUP_TIMEOUT = 120.0
# Small enough that any request (even a fuzzer's) is cheap on the CPU; 64 slots for the load test.
SERVER_FLAGS = ("--context-length", "256", "--page-size", "16", "--max-running-requests", "64",
                "--chunked-prefill-size", "128")


@dataclass(frozen=True)
class Server:
    url: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen
    log: Path
    headers: dict[str, str] = field(default_factory=dict)  # the API key's, when the server has one

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, headers={**self.headers, **kw.pop("headers", {})}, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, headers={**self.headers, **kw.pop("headers", {})}, **kw)

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def gauges(self) -> dict[str, float]:
        """The running and waiting request gauges of /metrics."""
        return {line.split("{")[0]: float(line.split()[-1]) for line in self.get("/metrics").text.splitlines()
                if line.startswith(("minisgl:num_running_reqs", "minisgl:num_queue_reqs"))}

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """Stats once the engine is idle and its pools passed the integrity check since its last step."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.get("/server_info").json()
            if info["idle_checked"]:
                return info["stats"]
            time.sleep(0.1)
        raise AssertionError(f"server not idle after {timeout} s: {info}\n{self.log_tail()}")


KILL_BODY = {"prompt": "The quick brown fox", "max_tokens": 200, "ignore_eos": True, "temperature": 0}


@dataclass(frozen=True)
class Killed:
    streams: list[str]  # the last SSE event of each stream (before [DONE])
    posts: list[httpx.Response]  # the non-streaming requests' answers
    after: httpx.Response  # a request sent once everything in flight had ended


async def kill_mid_run(url: str, pid: int, timeout: float, streams: int = 12, posts: int = 6) -> Killed:
    """SIGKILL pid while streams and non-streaming requests run; every wait is bounded by timeout."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        started = asyncio.Event()

        async def stream() -> str:
            last = ""
            async with client.stream("POST", "/v1/completions", json={**KILL_BODY, "stream": True}) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        last = line[6:]
                        started.set()
            return last

        running = [asyncio.ensure_future(stream()) for _ in range(streams)]
        waiting = [asyncio.ensure_future(client.post("/v1/completions", json=KILL_BODY)) for _ in range(posts)]
        await asyncio.wait_for(started.wait(), timeout)
        await asyncio.sleep(0.6)  # a stats report with the running requests reaches the gauges
        os.kill(pid, signal.SIGKILL)
        done = await asyncio.wait_for(asyncio.gather(*running, *waiting), timeout)
        after = await client.post("/v1/completions", json={**KILL_BODY, "max_tokens": 2})
        return Killed(done[:streams], done[streams:], after)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(
    log_dir: Path, *flags: str, entry: tuple[str, ...] = ("-m", "minisgl"), env: dict[str, str] | None = None,
    api_key: str | None = None,
) -> Iterator[Server]:
    """entry: what python runs (a test script wrapping `minisgl serve`); env: extra variables."""
    port = _free_port()
    log = log_dir / f"server-{port}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, *entry, "serve", "--port", str(port), "--log-level", "warning", *flags]
    if api_key is not None:
        cmd += ["--api-key", api_key]
    with open(log, "w") as out:
        # Its own process group, so teardown can stop the children even if the server is stuck.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", proc, log, {"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy after {STARTUP_TIMEOUT} s:\n{server.log_tail()}")
            try:
                if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield server
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # graceful: uvicorn shuts down, then stops the children
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of this server's group
    except ProcessLookupError:
        pass
    proc.wait(15)


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory, _isolated_cache: None) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("server"), *SERVER_FLAGS) as server:
        yield server
