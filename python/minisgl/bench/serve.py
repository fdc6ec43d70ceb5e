"""`python -m minisgl.bench serve`: a dataset's prompts against an OpenAI-compatible /v1/completions
(minisgl, SGLang or vLLM), streamed, at a request rate (Poisson arrivals) and/or a concurrency cap.
Token counts come from the server's usage; timings from the arrival of streamed chunks."""
from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from minisgl.bench.dataset import BenchRequest
from minisgl.bench.report import RequestResult

REQUEST_TIMEOUT = 600.0  # seconds for one request; a benchmark never waits forever
# Idle connections are reused for at most this long: below uvicorn's 5 s keep-alive (vLLM's and
# SGLang's servers), so no request goes out on a connection the server is closing (httpx's own 5 s
# made that a race, which failed 1 request in 1,000 of a 512-stream run).
KEEPALIVE_EXPIRY = 2.0
# Connections per httpx client: its pool scans every connection it holds on each request event, so
# one client over 512 streams spent more CPU on that scan than on the responses (cProfile, 1,000
# streamed requests at 512 concurrent); clients of this many connections each keep it small.
CONNECTIONS_PER_CLIENT = 32


@dataclass(frozen=True)
class ServeConfig:
    base_url: str
    model: str
    request_rate: float  # requests/s; inf = all at once
    max_concurrency: int | None
    ignore_eos: bool
    seed: int


async def _one(client: httpx.AsyncClient, cfg: ServeConfig, req: BenchRequest) -> RequestResult:
    body = {"model": cfg.model, "prompt": list(req.prompt_ids), "max_tokens": req.output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": cfg.ignore_eos}
    start = time.perf_counter()
    stamps: list[float] = []
    output_len = cached = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return RequestResult(False, len(req.prompt_ids), 0, 0.0, 0.0, (), (await r.aread()).decode()[:500])
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return RequestResult(False, len(req.prompt_ids), 0, 0.0, 0.0, (), str(chunk["error"]))
                if chunk.get("usage"):
                    output_len = chunk["usage"]["completion_tokens"]
                    cached = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    stamps.append(time.perf_counter())
    except httpx.HTTPError as e:
        return RequestResult(False, len(req.prompt_ids), 0, 0.0, 0.0, (), f"{type(e).__name__}: {e}")
    latency = time.perf_counter() - start
    if not stamps:
        return RequestResult(False, len(req.prompt_ids), output_len, latency, latency, (), "no tokens streamed")
    itl = tuple(b - a for a, b in zip(stamps, stamps[1:]))
    return RequestResult(True, len(req.prompt_ids), output_len, latency, stamps[0] - start, itl, cached_len=cached)


async def run(cfg: ServeConfig, reqs: list[BenchRequest], progress: bool = True) -> tuple[list[RequestResult], float]:
    """(per-request results in order, wall-clock duration)."""
    rng = random.Random(cfg.seed)
    limit = cfg.max_concurrency or len(reqs)
    # A request holds one slot while it runs (at most `limit` at once, first come first served);
    # slot i belongs to client i // CONNECTIONS_PER_CLIENT, whose pool is sized for its slots.
    slots: asyncio.Queue[int] = asyncio.Queue()
    for i in range(limit):
        slots.put_nowait(i)
    bar = tqdm(total=len(reqs), disable=not progress, desc="requests")
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for first in range(0, limit, CONNECTIONS_PER_CLIENT):
            n = min(CONNECTIONS_PER_CLIENT, limit - first)
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=KEEPALIVE_EXPIRY)
            clients.append(await stack.enter_async_context(
                httpx.AsyncClient(base_url=cfg.base_url, timeout=REQUEST_TIMEOUT, limits=limits)))

        async def guarded(req: BenchRequest) -> RequestResult:
            slot = await slots.get()
            try:
                res = await _one(clients[slot // CONNECTIONS_PER_CLIENT], cfg, req)
            finally:
                slots.put_nowait(slot)
            bar.update(1)
            return res

        start = time.perf_counter()
        tasks = []
        for req in reqs:
            tasks.append(asyncio.create_task(guarded(req)))
            if cfg.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(cfg.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    bar.close()
    return list(results), duration


def served_model(base_url: str) -> tuple[str, str | None]:
    """(the model id, its tokenizer's folder where the server says: /get_model_info on minisgl and
    SGLang, else /v1/models' root, vLLM's checkpoint path)."""
    card = httpx.get(base_url + "/v1/models", timeout=30).raise_for_status().json()["data"][0]
    info = httpx.get(base_url + "/get_model_info", timeout=30)
    return card["id"], info.json()["tokenizer_path"] if info.status_code == 200 else card.get("root")
