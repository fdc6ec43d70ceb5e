"""A bounded load test on loopback: 600 requests at concurrency 64, a fifth of them aborted by
closing the connection mid-stream (or mid-wait). Afterwards every page and slot is free, every
other request got its full response, and the server is healthy. Bounded: tiny model, <= 12 new
tokens each, and the whole run is capped at LOAD_TIMEOUT seconds."""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx
import pytest

from server_harness import Server

NUM_REQUESTS = 600
CONCURRENCY = 64
ABORT_FRACTION = 0.2
LOAD_TIMEOUT = 100.0


@dataclass(frozen=True)
class Plan:
    i: int
    prompt: list[int]
    max_tokens: int
    stream: bool
    abort_after: int | None  # streamed chunks (or, without streaming, 10 ms ticks) before closing


def _plans(rng: random.Random) -> list[Plan]:
    plans = []
    for i in range(NUM_REQUESTS):
        abort = rng.random() < ABORT_FRACTION
        stream = abort or rng.random() < 0.7
        plans.append(Plan(i, [rng.randrange(3, 500) for _ in range(rng.randint(4, 40))], rng.randint(4, 12),
                          stream, rng.randint(0, 3) if abort else None))
    return plans


async def _one(client: httpx.AsyncClient, p: Plan) -> str:
    body = {"prompt": p.prompt, "max_tokens": p.max_tokens, "temperature": 0.7, "ignore_eos": True,
            "stream": p.stream, "stream_options": {"include_usage": True}}
    if not p.stream:
        task = asyncio.ensure_future(client.post("/v1/completions", json=body))
        if p.abort_after is not None:
            await asyncio.sleep(0.01 * p.abort_after)
            task.cancel()  # httpx drops the connection
            return "aborted"
        r = await task
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["usage"]["completion_tokens"] == p.max_tokens and data["choices"][0]["finish_reason"] == "length"
        return "done"
    chunks = 0
    finish, usage = None, None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"]:
                chunks += 1
                finish = chunk["choices"][0]["finish_reason"] or finish
            else:
                usage = chunk["usage"]
            if p.abort_after is not None and chunks > p.abort_after:
                return "aborted"  # leaving the block closes the connection mid-stream
    assert finish == "length" and usage["completion_tokens"] == p.max_tokens, (finish, usage)
    return "done"


async def _load(url: str, plans: list[Plan]) -> list[str]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    sem = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def guarded(p: Plan) -> str:
            async with sem:
                return await _one(client, p)

        return await asyncio.wait_for(asyncio.gather(*(guarded(p) for p in plans)), LOAD_TIMEOUT)


@pytest.mark.load
def test_load_with_aborts(live_server: Server) -> None:
    plans = _plans(random.Random(0))
    start = time.monotonic()
    results = asyncio.run(_load(live_server.url, plans))
    elapsed = time.monotonic() - start
    aborted = results.count("aborted")
    assert results.count("done") + aborted == NUM_REQUESTS, "every request got a full response or was aborted"
    assert 0.1 * NUM_REQUESTS < aborted < 0.3 * NUM_REQUESTS
    stats = live_server.wait_idle()
    assert (stats["used_pages"], stats["used_slots"], stats["num_running"], stats["num_waiting"]) == (0, 0, 0, 0)
    assert live_server.get("/health").status_code == 200
    metrics = live_server.get("/metrics").text
    server_aborts = next(float(line.split()[-1]) for line in metrics.splitlines()
                         if line.startswith("minisgl:num_requests_total") and 'finish_reason="abort"' in line)
    assert server_aborts >= aborted / 2, "closed connections abort their requests in the engine"
    after = live_server.post("/v1/completions", json={"prompt": "ok", "max_tokens": 3, "ignore_eos": True})
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 3
    print(f"\n{NUM_REQUESTS} requests ({aborted} aborted) at concurrency {CONCURRENCY} in {elapsed:.1f} s")
