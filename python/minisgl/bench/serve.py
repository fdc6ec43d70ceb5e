"""`python -m minisgl.bench serve`: a dataset's prompts against an OpenAI-compatible /v1/completions
(minisgl, SGLang or vLLM; chat conversations through /v1/chat/completions), streamed, at a request
rate (Poisson arrivals) and/or a concurrency cap.
Token counts come from the server's usage; timings from the arrival of streamed chunks.

The streams are read with aiohttp, as SGLang's and vLLM's benchmark clients read them: a streamed
token costs this process less than half what it cost through httpx (benchmarks/bench_host_path.py,
400 x 128 tokens at 256 streams on a 2-core CPU: 2.17 against 4.82 CPU seconds). A client that
falls behind reads two tokens at once and reports a near-zero inter-token gap; the 35B Throughput
profile's 8.7K tokens/s at 512 streams came close to httpx's limit (its ITL median read 0.1 ms)."""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence, TypeVar

import aiohttp
import httpx
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from minisgl.bench.dataset import BenchRequest, plain_vocab, random_requests
from minisgl.bench.report import RequestResult, turn_ttfts

REQUEST_TIMEOUT = 600.0  # seconds for one request; a benchmark never waits forever
# Idle connections are reused for at most this long: below uvicorn's 5 s keep-alive (vLLM's and
# SGLang's servers), so no request goes out on a connection the server is closing (a client's 5 s
# made that a race, which failed 1 request in 1,000 of a 512-stream run).
KEEPALIVE_EXPIRY = 2.0


@dataclass(frozen=True)
class ServeConfig:
    base_url: str
    model: str
    request_rate: float  # requests/s; inf = all at once
    max_concurrency: int | None
    ignore_eos: bool
    seed: int


async def _one(client: aiohttp.ClientSession, cfg: ServeConfig, req: BenchRequest, want_ids: bool = False) -> RequestResult:
    """One streamed completion; `want_ids`: also the output's token ids (vLLM's return_token_ids)."""
    body = {"model": cfg.model, "prompt": list(req.prompt_ids), "max_tokens": req.output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": cfg.ignore_eos,
            **({"return_token_ids": True} if want_ids else {})}
    return await _stream(client, cfg.base_url + "/v1/completions", body, len(req.prompt_ids))


def _piece(choice: dict) -> tuple[str, str]:
    """(the text a streamed choice carries, the part of it an answer's content is): a completion's
    text, or a chat delta's content or reasoning (SGLang's and vLLM's reasoning parsers' names)."""
    if "text" in choice:
        return choice["text"] or "", choice["text"] or ""
    delta = choice.get("delta") or {}
    content = delta.get("content") or ""
    return content or delta.get("reasoning_content") or delta.get("reasoning") or "", content


async def _stream(client: aiohttp.ClientSession, url: str, body: dict, prompt_len: int) -> RequestResult:
    """POST a streamed request and time its chunks; the prompt's length from the usage where it says."""
    start = time.perf_counter()
    stamps: list[float] = []
    output_len = cached = 0
    output_ids: list[int] = []
    content: list[str] = []
    try:
        async with client.post(url, json=body) as r:
            if r.status != 200:
                return RequestResult(False, prompt_len, 0, 0.0, 0.0, (), (await r.text())[:500])
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return RequestResult(False, prompt_len, 0, 0.0, 0.0, (), str(chunk["error"]))
                if chunk.get("usage"):
                    output_len = chunk["usage"]["completion_tokens"]
                    prompt_len = chunk["usage"].get("prompt_tokens", prompt_len)
                    cached = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                if chunk.get("choices"):
                    output_ids.extend(chunk["choices"][0].get("token_ids") or ())
                    text, said = _piece(chunk["choices"][0])
                    content.append(said)
                    if text:
                        stamps.append(time.perf_counter())
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return RequestResult(False, prompt_len, 0, 0.0, 0.0, (), f"{type(e).__name__}: {e}")
    latency = time.perf_counter() - start
    if not stamps:
        return RequestResult(False, prompt_len, output_len, latency, latency, (), "no tokens streamed")
    itl = tuple(b - a for a, b in zip(stamps, stamps[1:]))
    return RequestResult(True, prompt_len, output_len, latency, stamps[0] - start, itl, cached_len=cached,
                         output_ids=tuple(output_ids), output_text="".join(content))


T = TypeVar("T")
Work = Callable[[aiohttp.ClientSession, T], Awaitable[list[RequestResult]]]


async def run(cfg: ServeConfig, reqs: list[BenchRequest], progress: bool = True) -> tuple[list[RequestResult], float]:
    """(per-request results in order, wall-clock duration)."""

    async def one(client: aiohttp.ClientSession, req: BenchRequest) -> list[RequestResult]:
        return [await _one(client, cfg, req)]

    return await _drive(cfg, reqs, one, progress)


async def _talks(cfg: ServeConfig, firsts: Sequence[T], turns: int,
                 send: Callable[[aiohttp.ClientSession, T], Awaitable[RequestResult]],
                 follow: Callable[[T, RequestResult], T], progress: bool) -> tuple[list[list[RequestResult]], float]:
    """Conversations: each sends its first item, then `turns` - 1 more, each what `follow` makes of
    the last one and its result, one after the other; at most max_concurrency conversations at
    once. -> (each conversation's results by turn, wall-clock duration)."""
    by_first: dict[int, list[RequestResult]] = {}

    async def talk(client: aiohttp.ClientSession, item: T) -> list[RequestResult]:
        results = []
        for turn in range(turns):
            res = await send(client, item)
            results.append(res)
            if not res.ok or turn == turns - 1:
                break
            item = follow(item, res)
        return results

    _, duration = await _drive(cfg, firsts, talk, progress, by_first)
    return [by_first[i] for i in range(len(firsts))], duration


def _check(conversations: int, turns: int, first_len: int, tool_len: int, output_len: int) -> None:
    if min(conversations, turns, first_len, output_len) < 1 or tool_len < 0:
        raise ValueError("--agent-conversations, --agent-turns, --agent-first-len and --output-len must be >= 1, "
                         "--agent-tool-len >= 0")


def run_agents(cfg: ServeConfig, tokenizer: PreTrainedTokenizerBase, conversations: int, first_len: int, turns: int,
               tool_len: int, output_len: int, progress: bool = True) -> tuple[list[RequestResult], float, dict]:
    """Agent conversations through /v1/completions: each next prompt is the last one, its answer's
    token ids and `tool_len` random tokens (a tool's result). -> (every result, duration, the
    figures only conversations have: each turn's TTFT)."""
    _check(conversations, turns, first_len, tool_len, output_len)
    rng, vocab = random.Random(cfg.seed), plain_vocab(tokenizer)

    def follow(req: BenchRequest, res: RequestResult) -> BenchRequest:
        if len(res.output_ids) != res.output_len:
            raise ValueError("the server sent no token ids (vLLM's return_token_ids): the next turn needs them")
        return BenchRequest(req.prompt_ids + res.output_ids + tuple(rng.choices(vocab, k=tool_len)), req.output_len)

    firsts = random_requests(tokenizer, conversations, first_len, output_len, 1.0, cfg.seed)
    talks, duration = asyncio.run(_talks(cfg, firsts, turns, lambda c, r: _one(c, cfg, r, want_ids=True), follow,
                                         progress))
    return [r for talk in talks for r in talk], duration, {"turn_ttft_ms": turn_ttfts(talks)}


def run_chats(cfg: ServeConfig, tokenizer: PreTrainedTokenizerBase, conversations: int, first_len: int, turns: int,
              user_len: int, output_len: int, progress: bool = True) -> tuple[list[RequestResult], float, dict]:
    """Chat conversations through /v1/chat/completions, held as a chat client holds them: messages
    of text (a first user message of random text of about `first_len` tokens, each next one about
    `user_len`), each answer's content sent back as the assistant's message; the server renders
    its chat template. -> as run_agents."""
    _check(conversations, turns, first_len, user_len, output_len)
    rng, vocab = random.Random(cfg.seed), plain_vocab(tokenizer)

    def text(n: int) -> str:  # random ids' text re-encodes to more tokens: n of those, as text
        ids = tokenizer.encode(tokenizer.decode(rng.choices(vocab, k=n)), add_special_tokens=False)
        return tokenizer.decode(ids[:n])

    def send(client: aiohttp.ClientSession, messages: list[dict]) -> Awaitable[RequestResult]:
        body = {"model": cfg.model, "messages": messages, "max_tokens": output_len, "temperature": 0.0,
                "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": cfg.ignore_eos}
        return _stream(client, cfg.base_url + "/v1/chat/completions", body, 0)

    def follow(messages: list[dict], res: RequestResult) -> list[dict]:
        return [*messages, {"role": "assistant", "content": res.output_text},
                {"role": "user", "content": text(user_len)}]

    firsts = [[{"role": "user", "content": text(first_len)}] for _ in range(conversations)]
    talks, duration = asyncio.run(_talks(cfg, firsts, turns, send, follow, progress))
    return [r for talk in talks for r in talk], duration, {"turn_ttft_ms": turn_ttfts(talks)}


async def _drive(cfg: ServeConfig, reqs: Sequence[T], work: Work, progress: bool,
                 by_item: dict[int, list[RequestResult]] | None = None) -> tuple[list[RequestResult], float]:
    """Run `work` on every item (a request, or a conversation's first), each holding one of
    max_concurrency slots while it runs, arriving at the request rate. -> (every result, in item
    order; wall-clock duration); `by_item` also gets each item's results."""
    rng = random.Random(cfg.seed)
    limit = cfg.max_concurrency or len(reqs)
    slots = asyncio.Semaphore(limit)  # an item holds one while it runs, first come first served
    bar = tqdm(total=len(reqs), disable=not progress, desc="requests")
    connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_EXPIRY)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)) as client:

        async def guarded(i: int, req: T) -> list[RequestResult]:
            async with slots:
                res = await work(client, req)
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
