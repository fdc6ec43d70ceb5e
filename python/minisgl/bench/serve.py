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
from typing import Awaitable, Callable

import httpx
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from minisgl.bench.dataset import BenchRequest, plain_vocab, random_requests
from minisgl.bench.report import RequestResult, turn_ttfts

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


async def _one(client: httpx.AsyncClient, cfg: ServeConfig, req: BenchRequest, want_ids: bool = False) -> RequestResult:
    """One streamed completion; `want_ids`: also the output's token ids (vLLM's return_token_ids)."""
    body = {"model": cfg.model, "prompt": list(req.prompt_ids), "max_tokens": req.output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": cfg.ignore_eos,
            **({"return_token_ids": True} if want_ids else {})}
    start = time.perf_counter()
    stamps: list[float] = []
    output_len = cached = 0
    output_ids: list[int] = []
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
                if chunk.get("choices"):
                    output_ids.extend(chunk["choices"][0].get("token_ids") or ())
                    if chunk["choices"][0].get("text"):
                        stamps.append(time.perf_counter())
    except httpx.HTTPError as e:
        return RequestResult(False, len(req.prompt_ids), 0, 0.0, 0.0, (), f"{type(e).__name__}: {e}")
    latency = time.perf_counter() - start
    if not stamps:
        return RequestResult(False, len(req.prompt_ids), output_len, latency, latency, (), "no tokens streamed")
    itl = tuple(b - a for a, b in zip(stamps, stamps[1:]))
    return RequestResult(True, len(req.prompt_ids), output_len, latency, stamps[0] - start, itl, cached_len=cached,
                         output_ids=tuple(output_ids))


Work = Callable[[httpx.AsyncClient, BenchRequest], Awaitable[list[RequestResult]]]


async def run(cfg: ServeConfig, reqs: list[BenchRequest], progress: bool = True) -> tuple[list[RequestResult], float]:
    """(per-request results in order, wall-clock duration)."""

    async def one(client: httpx.AsyncClient, req: BenchRequest) -> list[RequestResult]:
        return [await _one(client, cfg, req)]

    return await _drive(cfg, reqs, one, progress)


async def run_conversations(cfg: ServeConfig, firsts: list[BenchRequest], turns: int, tool_len: int, vocab: list[int],
                            progress: bool = True) -> tuple[list[list[RequestResult]], float]:
    """Agent conversations: each sends its first prompt, then `turns` - 1 more, each the last
    prompt, the answer's token ids and `tool_len` random tokens (a tool's result), one after the
    other; at most max_concurrency conversations at once. -> (each conversation's results by turn,
    wall-clock duration)."""
    rng = random.Random(cfg.seed)
    by_first: dict[int, list[RequestResult]] = {}

    async def talk(client: httpx.AsyncClient, req: BenchRequest) -> list[RequestResult]:
        results = []
        for turn in range(turns):
            res = await _one(client, cfg, req, want_ids=True)
            results.append(res)
            if not res.ok or turn == turns - 1:
                break
            if len(res.output_ids) != res.output_len:
                raise ValueError("the server sent no token ids (vLLM's return_token_ids): the next turn needs them")
            req = BenchRequest(req.prompt_ids + res.output_ids + tuple(rng.choices(vocab, k=tool_len)), req.output_len)
        return results

    flat, duration = await _drive(cfg, firsts, talk, progress, by_first)
    return [by_first[i] for i in range(len(firsts))], duration


def run_agents(cfg: ServeConfig, tokenizer: PreTrainedTokenizerBase, conversations: int, first_len: int, turns: int,
               tool_len: int, output_len: int, progress: bool = True) -> tuple[list[RequestResult], float, dict]:
    """run_conversations on first prompts of random tokens: (every result, duration, the figures
    only conversations have: each turn's TTFT)."""
    if min(conversations, turns, first_len, output_len) < 1 or tool_len < 0:
        raise ValueError("--agent-conversations, --agent-turns, --agent-first-len and --output-len must be >= 1, "
                         "--agent-tool-len >= 0")
    firsts = random_requests(tokenizer, conversations, first_len, output_len, 1.0, cfg.seed)
    talks, duration = asyncio.run(run_conversations(cfg, firsts, turns, tool_len, plain_vocab(tokenizer), progress))
    return [r for talk in talks for r in talk], duration, {"turn_ttft_ms": turn_ttfts(talks)}


async def _drive(cfg: ServeConfig, reqs: list[BenchRequest], work: Work, progress: bool,
                 by_item: dict[int, list[RequestResult]] | None = None) -> tuple[list[RequestResult], float]:
    """Run `work` on every item (a request, or a conversation's first), each holding one of
    max_concurrency slots while it runs, arriving at the request rate. -> (every result, in item
    order; wall-clock duration); `by_item` also gets each item's results."""
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

        async def guarded(i: int, req: BenchRequest) -> list[RequestResult]:
            slot = await slots.get()
            try:
                res = await work(clients[slot // CONNECTIONS_PER_CLIENT], req)
            finally:
                slots.put_nowait(slot)
            bar.update(1)
            if by_item is not None:
                by_item[i] = res
            return res

        start = time.perf_counter()
        tasks = []
        for i, req in enumerate(reqs):
            tasks.append(asyncio.create_task(guarded(i, req)))
            if cfg.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(cfg.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    bar.close()
    return [r for rs in results for r in rs], duration


def served_model(base_url: str) -> tuple[str, str | None]:
    """(the model id, its tokenizer's folder where the server says: /get_model_info on minisgl and
    SGLang, else /v1/models' root, vLLM's checkpoint path)."""
    card = httpx.get(base_url + "/v1/models", timeout=30).raise_for_status().json()["data"][0]
    info = httpx.get(base_url + "/get_model_info", timeout=30)
    return card["id"], info.json()["tokenizer_path"] if info.status_code == 200 else card.get("root")
