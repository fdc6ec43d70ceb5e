"""Request rules every scheduler applies the same way (colocated and AFD): what may be queued,
what one step runs, when a request is done or aborted, and what a step reports for it."""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Protocol

import torch

from minisgl.kvcache.allocator import Admission
from minisgl.prefill_budget import lone_prompt_tokens, step_prefill_budget
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, GenerateRequest, RequestOutput
from minisgl.scheduler.prompt_check import prompt_error
from minisgl.scheduler.request import Request
from minisgl.scheduler.stop import DecoderFactory, StopChecker


def validate_request(
    prompt_ids: list[int], params: SamplingParams, max_seq_len: int, vocab_size: int, has_tokenizer: bool
) -> None:
    if (error := prompt_error(prompt_ids, max_seq_len, vocab_size)) is not None:
        raise ValueError(error)
    if params.n != 1:
        raise ValueError(f"n={params.n}: an engine request samples once; the caller fans n out (for_choice)")
    if params.stop and not has_tokenizer:
        raise ValueError("stop strings need a tokenizer")
    params.check_vocab(vocab_size)


def check_finish(r: Request, tok: int, eos: frozenset[int], max_seq_len: int) -> None:
    """Set r.finish_reason after r sampled `tok` (already appended to its output)."""
    p = r.params
    if tok in p.stop_token_ids or (not p.ignore_eos and tok in eos):
        r.finish_reason, r.matched_stop = FINISH_STOP, tok
    # Stop strings count only once the output is past min_tokens (vLLM's rule), but the text grows regardless.
    elif r.stop_checker is not None and (hit := r.stop_checker.push(tok, len(r.output_ids) > p.min_tokens)) is not None:
        r.finish_reason, r.matched_stop = FINISH_STOP, hit
    elif len(r.output_ids) >= p.max_tokens or len(r.prompt_ids) + len(r.output_ids) >= max_seq_len:
        r.finish_reason = FINISH_LENGTH


def decodable(r: Request, max_seq_len: int) -> bool:
    """Prefilled, its newest token not yet fed, and not already at a length limit."""
    return (
        r.prefill_done
        and not r.finished
        and r.num_computed == r.seq_len - 1
        and r.num_sampled < r.params.max_tokens
        and r.seq_len < max_seq_len
    )


def take_output(r: Request) -> RequestOutput:
    """What changed since the last report: new tokens and logprobs, and the finish once."""
    prompt_lp = None
    if r.prompt_logprobs is not None and not r.prompt_logprobs_sent and r.prefill_done:
        prompt_lp, r.prompt_logprobs_sent = tuple(r.prompt_logprobs), True
    out = RequestOutput(
        rid=r.rid,
        new_token_ids=tuple(r.output_ids[r.num_reported :]),
        logprobs=tuple(r.new_logprobs),
        prompt_logprobs=prompt_lp,
        finish_reason=r.finish_reason,
        matched_stop=r.matched_stop,
        num_prompt_tokens=len(r.prompt_ids),
        num_output_tokens=len(r.output_ids),
        num_cached_tokens=r.num_cached,
    )
    r.num_reported = len(r.output_ids)
    r.new_logprobs.clear()
    return out


def take_outputs(touched: Iterable[Request], release: Callable[[Request], None]) -> list[RequestOutput]:
    """The reports of the requests a step touched; a finished request is released once reported."""
    outputs = []
    for r in touched:
        outputs.append(take_output(r))
        if r.finished:
            release(r)
    return outputs


def abort_request(
    r: Request,
    waiting: deque[Request],
    forget: Callable[[Request], None],
    release: Callable[[Request], None],
) -> RequestOutput:
    """End r as aborted and return its last report. A queued request (no slot yet) leaves `waiting`
    and is forgotten; a running one is released, which frees its slot and pages and forgets it."""
    r.finish_reason = FINISH_ABORT
    if r.slot is None:
        waiting.remove(r)
        forget(r)
    else:
        release(r)
    return take_output(r)


def new_request(
    req: GenerateRequest, make_decoder: DecoderFactory | None, generator: torch.Generator | None = None
) -> Request:
    p = req.params
    checker = StopChecker(p.stop, make_decoder(p.skip_special_tokens)) if p.stop else None
    return Request(req.rid, list(req.prompt_ids), p, generator, checker, req.chat_turn)


class SlotPool(Protocol):
    """What admission needs of a pool: the colocated HybridPool or an AFD lane's PoolAllocator."""

    def can_allocate(self, reserve_tokens: int) -> bool: ...

    def admit(self, prompt: list[int], reserve_tokens: int, reuse: bool, chat_turn: bool = False) -> Admission: ...

    def awaits_prefix(self, prompt: list[int]) -> bool: ...


def admit(r: Request, pool: SlotPool, max_seq_len: int) -> None:
    """Give r a slot, starting it after the longest cached prefix of its prompt, and mark the
    prefixes of its own to cache as its prefill passes them. A prompt_logprobs request scores every
    prompt token, so it neither reuses a prefix nor caches one."""
    a = pool.admit(r.prompt_ids, reserve_tokens(r, max_seq_len), reuse=r.prompt_logprobs is None, chat_turn=r.chat_turn)
    r.slot, r.num_cached, r.num_computed, r.checkpoints = a.slot, a.cached, a.cached, a.checkpoints


# --schedule-policy lpm orders at most this many waiting requests (SGLang's bound): beyond it the
# prefix lookups of every step would cost the host more than the reuse saves.
LPM_WINDOW = 128


def order_by_cached_prefix(waiting: deque[Request], cached_len: Callable[[Request], int]) -> None:
    """--schedule-policy lpm: the waiting requests with the longest cached prefix first, first come
    first served among equals, while at most LPM_WINDOW wait."""
    if 1 < len(waiting) <= LPM_WINDOW:
        ordered = sorted(waiting, key=lambda r: -cached_len(r))  # stable: arrival order among equals
        waiting.clear()
        waiting.extend(ordered)


def reserve_tokens(r: Request, max_seq_len: int) -> int:
    """Pages are reserved at admission for the worst case, so a running request never runs out."""
    return min(len(r.prompt_ids) + r.params.max_tokens, max_seq_len)


# Prompt tokens per step whose logits a prompt_logprobs request needs: each such row costs a
# vocabulary of fp32 logits (1 MB at 248K), so long prompts are scored a bounded chunk at a time.
PROMPT_LOGPROB_TOKENS = 256


def plan_batch(
    running: list[Request],
    waiting: deque[Request],
    pool: SlotPool,
    max_seq_len: int,
    chunk_size: int,
    prefill_budget: int,
    per_request: int,
) -> list[tuple[Request, int]]:
    """(request, tokens to feed) for one step: every decodable request, then prefill chunks (each at
    most chunk_size; in steps without decodes grown by the budget nobody waiting could take:
    _top_up), admitting waiting requests first-come first-served while the pool can reserve
    their pages and a slot and no running request is about to cache a prefix of the next one's
    prompt (then it waits for that, a step or two, and reuses it). The step's prompt tokens are at
    most prefill_budget, and while requests decode at most what step_prefill_budget allows beside
    them: one chunk with few requests, which bounds the inter-token latency, more when many requests
    are present or prompts outnumber the decodes, so a crowd or a queue of long prompts is prefilled
    as fast as the GPU can."""
    items = [(r, 1) for r in running if decodable(r, max_seq_len)]
    decoding = len(items)
    prefilling = len(waiting) + sum(not r.prefill_done for r in running)
    budget = step_prefill_budget(decoding, prefilling, len(running) + len(waiting), chunk_size, per_request,
                                 prefill_budget)
    logprob_budget = PROMPT_LOGPROB_TOKENS

    def chunk_len(r: Request) -> int:
        n = min(len(r.prompt_ids) - r.num_computed, chunk_size, budget)
        return min(n, logprob_budget) if r.prompt_logprobs is not None else n

    def take(r: Request, n: int) -> None:
        nonlocal budget, logprob_budget
        items.append((r, n))
        budget -= n
        if r.prompt_logprobs is not None:
            logprob_budget -= n

    for r in running:
        if not r.prefill_done and (n := chunk_len(r)) > 0:
            take(r, n)
    while (waiting and chunk_len(waiting[0]) > 0 and pool.can_allocate(reserve_tokens(waiting[0], max_seq_len))
           and not (waiting[0].prompt_logprobs is None and pool.awaits_prefix(waiting[0].prompt_ids))):
        r = waiting.popleft()
        admit(r, pool, max_seq_len)
        running.append(r)
        take(r, chunk_len(r))
    return _top_up(items, budget if not decoding else 0, lone_prompt_tokens(chunk_size, prefill_budget))


def _top_up(items: list[tuple[Request, int]], budget: int, lone: int) -> list[tuple[Request, int]]:
    """The step's prompt chunks, grown oldest first by `budget` tokens that nobody waiting could
    take, each to at most `lone` tokens (prefill_budget.lone_prompt_tokens). Chunks scoring prompt
    logprobs keep their bound."""
    out = []
    for r, n in items:
        if budget > 0 and not r.prefill_done and r.prompt_logprobs is None:
            extra = min(len(r.prompt_ids) - r.num_computed - n, lone - n, budget)
            if extra > 0:
                n, budget = n + extra, budget - extra
        out.append((r, n))
    return out
