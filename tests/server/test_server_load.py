"""A bounded load test on loopback, colocated and AFD 2+2: 1,000 requests at concurrency 64, of
which a fifth are aborted through /abort_request, a tenth are dropped by their client (the
connection closes mid-stream or mid-wait), and one in twenty are bad bodies.

Every client that stays gets a reply (a full completion, the aborted one's finish_reason "abort" with
what it had, or a 4xx naming what was wrong); afterwards every page and slot is free, nothing is
left in flight, the /metrics gauges are back to 0, and the server log holds no traceback. Bounded:
tiny model, few new tokens each, and the whole run is capped at LOAD_TIMEOUT seconds."""
from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from server_harness import SERVER_FLAGS, Server, running_server

NUM_REQUESTS = 1000
CONCURRENCY = 64
ABORT, CLOSE, BAD = 0.20, 0.10, 0.05
LOAD_TIMEOUT = 240.0
AFD_FLAGS = ("--afd", "--afd-attn-workers", "2", "--afd-expert-workers", "2", "--afd-num-mb", "2")

# (path, raw body, expected status): what a careless client sends.
BAD_BODIES = [
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4', 400),
    ("/v1/completions", json.dumps({"prompt": "hi", "temperature": -1}).encode(), 400),
    ("/v1/completions", json.dumps({"prompt": "hi", "seed": 2**64 - 1, "n": 2}).encode(), 400),
    ("/v1/completions", json.dumps({"prompt": "", "max_tokens": 4}).encode(), 400),
    ("/v1/completions", json.dumps({"prompt": "a\ud800b", "max_tokens": 4}).encode(), 400),
    ("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 10**6}).encode(), 400),
    ("/v1/completions", json.dumps({"prompt": "hi", "model": "no-such-model"}).encode(), 404),
    ("/v1/chat/completions", json.dumps({"messages": [], "max_tokens": 4}).encode(), 400),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                         "stop_token_ids": [2**70]}).encode(), 400),
]


@dataclass(frozen=True)
class Plan:
    i: int
    kind: str  # "full" | "abort" (/abort_request) | "close" (the client leaves) | "bad"
    prompt: list[int]
    max_tokens: int
    stream: bool
    after: int  # streamed chunks (or, without streaming, 10 ms ticks) before aborting or leaving


def _plans(rng: random.Random) -> list[Plan]:
    plans = []
    for i in range(NUM_REQUESTS):
        x = rng.random()
        kind = "abort" if x < ABORT else "close" if x < ABORT + CLOSE else "bad" if x < ABORT + CLOSE + BAD else "full"
        # Aborted and dropped requests are long enough to still run when their end comes.
        max_tokens = rng.randint(24, 48) if kind in ("abort", "close") else rng.randint(4, 12)
        plans.append(Plan(i, kind, [rng.randrange(3, 500) for _ in range(rng.randint(4, 40))], max_tokens,
                          rng.random() < 0.7, rng.randint(0, 3)))
    return plans


def _check_finish(p: Plan, finish: str | None, usage: dict | None, aborted: bool) -> str:
    """'done' for a full reply; 'aborted' when the abort landed (it may come after the finish)."""
    assert usage is not None and finish is not None, (p, finish, usage)
    if finish == "abort":
        assert aborted and usage["completion_tokens"] < p.max_tokens, (p, usage)
        return "aborted"
    assert finish == "length" and usage["completion_tokens"] == p.max_tokens, (p, finish, usage)
    return "done"


async def _one(client: httpx.AsyncClient, p: Plan) -> str:
    if p.kind == "bad":
        path, raw, status = BAD_BODIES[p.i % len(BAD_BODIES)]
        r = await client.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == status and r.json()["error"]["message"], (path, raw, r.status_code, r.text)
        return "refused"
    rid = f"load-{p.i}"
    body = {"prompt": p.prompt, "max_tokens": p.max_tokens, "temperature": 0.7, "ignore_eos": True,
            "stream": p.stream, "stream_options": {"include_usage": True}}
    headers = {"X-Request-Id": rid}

    async def abort() -> bool:
        return (await client.post("/abort_request", json={"rid": rid})).json()["aborted"] == 1

    if not p.stream:
        task = asyncio.ensure_future(client.post("/v1/completions", json=body, headers=headers))
        aborted = False
        if p.kind != "full":
            await asyncio.sleep(0.01 * (p.after + 1))
            if p.kind == "close":
                task.cancel()  # httpx drops the connection
                return "closed"
            aborted = await abort()
        r = await task
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["id"] == rid
        return _check_finish(p, data["choices"][0]["finish_reason"], data["usage"], aborted)
    chunks, finish, usage, aborted, done = 0, None, None, False, False
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"]:
                chunks += 1
                finish = chunk["choices"][0]["finish_reason"] or finish
            else:
                usage = chunk["usage"]
            if chunks == p.after + 1 and finish is None:
                if p.kind == "close":
                    return "closed"  # leaving the block closes the connection mid-stream
                if p.kind == "abort" and not aborted:
                    aborted = await abort()
    assert done, "every stream ends with [DONE]"
    return _check_finish(p, finish, usage, aborted)


async def _load(url: str, plans: list[Plan]) -> list[str]:
    limits = httpx.Limits(max_connections=2 * CONCURRENCY, max_keepalive_connections=2 * CONCURRENCY)
    sem = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def guarded(p: Plan) -> str:
            async with sem:
                return await _one(client, p)

        return await asyncio.wait_for(asyncio.gather(*(guarded(p) for p in plans)), LOAD_TIMEOUT)


@pytest.fixture(scope="module", params=["colocated", "afd"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           _isolated_cache: None) -> Iterator[Server]:
    flags = SERVER_FLAGS + (AFD_FLAGS if request.param == "afd" else ())
    with running_server(tmp_path_factory.mktemp(request.param), *flags) as s:
        yield s


@pytest.mark.load
def test_load_with_aborts_drops_and_bad_bodies(server: Server) -> None:
    plans = _plans(random.Random(0))
    start = time.monotonic()
    results = Counter(asyncio.run(_load(server.url, plans)))
    elapsed = time.monotonic() - start
    kinds = Counter(p.kind for p in plans)
    assert results["closed"] == kinds["close"] and results["refused"] == kinds["bad"]
    assert results["done"] + results["aborted"] == kinds["full"] + kinds["abort"], "every client got a reply"
    assert results["aborted"] > kinds["abort"] / 2, results  # most aborts land before the finish
    stats = server.wait_idle()
    assert (stats["used_pages"], stats["used_slots"], stats["num_running"], stats["num_waiting"]) == (0, 0, 0, 0)
    assert server.get("/server_info").json()["requests_in_flight"] == 0
    assert server.get("/health").status_code == 200
    deadline = time.monotonic() + 5  # the gauges follow the engine's stats, sent every 0.5 s
    while any(server.gauges().values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.gauges() == {"minisgl:num_running_reqs": 0.0, "minisgl:num_queue_reqs": 0.0}
    after = server.post("/v1/completions", json={"prompt": "ok", "max_tokens": 3, "ignore_eos": True})
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 3
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, server.log_tail()
    print(f"\n{NUM_REQUESTS} requests at concurrency {CONCURRENCY} in {elapsed:.1f} s: {dict(results)}")
