"""The memory planner: how many state slots and KV pages the pool gets from the device memory that
is left once the weights are loaded and the largest step's activations are reserved.

Pure arithmetic over byte counts, so it is tested on the CPU with a made-up budget; the engine
measures the budget on the device (engine/device_memory.py).

Rules, in order:
- the pool may take `fraction` of what is free after the weights and the measured peak of the
  largest prefill step (MemoryBudget.usable); each running request also costs the activations its
  decode row adds to a step (measured), so those scale with the slots;
- one request at the context length (without --context-length: at min(model limit,
  SIZING_TOKENS)) must fit, else planning fails and says what context would fit;
- slots: --max-mamba-cache-size (SGLang's flag: every state slot, running or the cache's) when
  given; else --max-running-requests plus the prefix cache's share (cache_slots_for); else, for
  models with GDN layers, the state gets ratio / (1 + ratio) of the pool (--mamba-full-memory-ratio,
  SGLang's flag and default, 0.9), and for models without, as many requests of SIZING_TOKENS tokens
  as fit (at most MAX_AUTO_RUNNING running either way); the running requests take what the cache's
  share leaves (slot_split); slots are lowered only when they would leave no room for one request
  at the context length;
- pages fill the rest, but never more than every slot at the context length needs; fewer than
  that is logged as pages lowered;
- without --context-length, the context is the model's limit, lowered to what the pages hold.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from minisgl.kvcache.hybrid_pool import PoolConfig, PoolLayout
from minisgl.kvcache.pages import _num_pages

GIB = float(1 << 30)
# Without --context-length, one request of this many tokens must fit; without
# --max-running-requests, a model without recurrent state gets as many such requests' slots.
SIZING_TOKENS = 8192
# SGLang's --mamba-full-memory-ratio default: state memory : KV memory. A slot's recurrent state
# costs as much as thousands of tokens of K/V, and the split decides between running many short
# requests (slots) and holding long ones (pages); measured on the served 122B (docs/benchmarks.md),
# this split runs 64 requests of 1K at once where sizing slots for 8K requests ran 59 and gave
# 0.86x the output throughput.
DEFAULT_STATE_RATIO = 0.9
MAX_AUTO_RUNNING = 512
# State slots kept for the prefix cache beside the running requests' (at least one): when every
# running slot is busy, a shared system prompt still has a slot to stay in. A sixteenth of the
# running slots: 3 of the 122B's 66 at defaults (its 8K requests are bound by pages, not slots; at
# 1K, 63 run instead of 66), 32 beside the 35B's 512 (1.9 GiB of its 61 GiB of K/V); fewer would
# leave the busiest services without their prompts, more would cost the 122B concurrent requests.
CACHE_SLOT_DIVISOR = 16


def cache_slots_for(running: int, prefix_cache: bool) -> int:
    """Slots the prefix cache keeps beside `running` running requests' by default."""
    return max(1, running // CACHE_SLOT_DIVISOR) if prefix_cache else 0


def slot_split(total: int, running: int | None, prefix_cache: bool) -> tuple[int, int]:
    """(running requests, cache slots) out of `total` state slots: --max-running-requests where
    given and the rest the cache's; else the most running requests that leave the cache its share."""
    if running is not None:
        if running > total or (total > running and not prefix_cache):
            raise ValueError(f"max_mamba_cache_size {total} must be at least max_running_requests {running}, and "
                             f"only more with the prefix cache, whose slots the rest are")
        return running, total - running
    running = total
    while running > 1 and running + cache_slots_for(running, prefix_cache) > total:
        running -= 1
    return running, total - running


class PoolDoesNotFit(ValueError):
    """Not even one request at the context length fits in the memory left for the pool."""


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes measured on the device once the weights are loaded."""

    free: int  # free device memory with the weights loaded and nothing else held
    step_reserve: int  # measured peak activations of the largest prefill step
    fraction: float  # share of (free - step_reserve) for slots, pages and per-request activations

    @property
    def usable(self) -> int:
        return max(0, int((self.free - self.step_reserve) * self.fraction))


@dataclass(frozen=True)
class PoolCosts:
    """What one request slot and one KV page cost."""

    slot_bytes: int  # conv + SSM state of one request (0 for models without GDN layers)
    row_bytes: int  # measured activations one more decoding request adds to a step (and its graph)
    page_bytes: int  # K + V of page_size tokens over all full-attention layers
    page_size: int

    def __post_init__(self) -> None:
        if self.page_bytes <= 0 or self.page_size <= 0 or self.slot_bytes < 0 or self.row_bytes < 0:
            raise ValueError(f"pool costs must be positive, got {self}")

    @classmethod
    def of(cls, layout: PoolLayout, flags: PoolConfig, dtype: torch.dtype, row_bytes: int) -> "PoolCosts":
        """The costs of a pool storing `layout` with activations in `dtype` (the conv state's dtype)
        and the flags' SSM and K/V dtypes, with the measured activations of one decode row."""
        return cls(layout.state_bytes_per_slot(dtype, getattr(torch, flags.ssm_dtype)), row_bytes,
                   layout.kv_bytes_per_page(flags.page_size, flags.kv_torch_dtype(dtype)), flags.page_size)

    def request(self, tokens: int) -> int:
        """One running request of `tokens` tokens: its slot, its activations and its pages."""
        return self.slot_bytes + self.row_bytes + _num_pages(tokens, self.page_size) * self.page_bytes


@dataclass(frozen=True)
class PoolPlan:
    max_running_requests: int
    num_pages: int
    max_seq_len: int
    state_bytes: int
    kv_bytes: int
    row_reserve_bytes: int  # activations kept free for the running requests' decode rows
    cache_slots: int = 0  # state slots beyond the running requests' that only the prefix cache holds
    notes: tuple[str, ...] = ()  # what was lowered or chosen, for the log

    def max_concurrency(self, tokens: int, page_size: int) -> int:
        return min(self.max_running_requests, self.num_pages // _num_pages(tokens, page_size))

    def config(self, flags: PoolConfig) -> PoolConfig:
        """The pool the flags asked for (page size, state dtype), at the planned sizes."""
        return replace(flags, max_running_requests=self.max_running_requests, max_seq_len=self.max_seq_len,
                       num_pages=self.num_pages, cache_slots=self.cache_slots)


def plan_pool(
    costs: PoolCosts,
    usable: int,
    model_max_len: int,
    context_length: int | None,
    max_running_requests: int | None,
    state_ratio: float = DEFAULT_STATE_RATIO,
    prefix_cache: bool = False,
    max_slots: int | None = None,
) -> PoolPlan:
    """Slots and pages out of `usable` bytes (MemoryBudget.usable), by the rules above; `max_slots`
    is --max-mamba-cache-size."""
    notes: list[str] = []
    slot_cost = costs.slot_bytes + costs.row_bytes
    # The length one request must be able to reach. Without --context-length the model's limit is a
    # bound, not a sizing target: a request may grow as far as the pages reach (set below).
    floor_len = context_length or min(model_max_len, SIZING_TOKENS)
    if usable < costs.request(floor_len):
        fit = max(0, (usable - slot_cost) // costs.page_bytes * costs.page_size)
        raise PoolDoesNotFit(
            f"not even one request of {floor_len} tokens fits: it needs {costs.request(floor_len) / GIB:.2f} GiB "
            f"and {usable / GIB:.2f} GiB are left for the pool, so at most --context-length {fit} would fit "
            f"(or raise --mem-fraction-static, or lower --max-prefill-tokens to shrink the activation reserve)"
        )
    if max_slots is not None:
        running, cache = slot_split(max_slots, max_running_requests, prefix_cache)
    elif max_running_requests is not None:
        running, cache = max_running_requests, cache_slots_for(max_running_requests, prefix_cache)
    else:
        if costs.slot_bytes:
            share = state_ratio / (1 + state_ratio)
            total = max(1, int(usable * share) // costs.slot_bytes)
            running, cache = slot_split(total, None, prefix_cache)
            how = f"{share:.0%} of the pool for state (--mamba-full-memory-ratio {state_ratio})"
        else:  # slots hold no state: the cache's cost nothing but table rows
            sizing = min(floor_len, SIZING_TOKENS)
            running = max(1, usable // costs.request(sizing))
            cache, how = cache_slots_for(running, prefix_cache), f"as many requests of {sizing} tokens as fit"
        if running > MAX_AUTO_RUNNING:
            running, cache = MAX_AUTO_RUNNING, cache_slots_for(MAX_AUTO_RUNNING, prefix_cache)
        notes.append(f"{running} running slots: {how}")

    def slots_bytes(running: int, cache: int) -> int:
        return running * slot_cost + cache * costs.slot_bytes

    room = usable - _num_pages(floor_len, costs.page_size) * costs.page_bytes  # >= slot_cost: checked above
    if slots_bytes(running, cache) > room:
        was = running
        while running > 1 and slots_bytes(running, cache_slots_for(running, prefix_cache)) > room:
            running -= 1
        cache = cache_slots_for(running, prefix_cache)
        cache = cache if slots_bytes(running, cache) <= room else 0
        notes.append(f"max_running_requests lowered from {was} to {running}: more slots would leave no "
                     f"room for one request of {floor_len} tokens")
    if cache:
        notes.append(f"{cache} more slots for the prefix cache (--max-mamba-cache-size {running + cache})")
    pages = (usable - slots_bytes(running, cache)) // costs.page_bytes
    if context_length is not None:
        wanted = running * _num_pages(context_length, costs.page_size)
        if pages < wanted:
            notes.append(f"KV pages lowered to {pages}: {running} requests of {context_length} tokens would need {wanted}")
        pages = min(pages, wanted)
        seq_len = context_length
    else:
        seq_len = min(model_max_len, pages * costs.page_size)
        notes.append(f"context {seq_len} tokens (the model allows {model_max_len}; no --context-length given)")
    return PoolPlan(
        max_running_requests=running,
        num_pages=pages,
        max_seq_len=seq_len,
        state_bytes=(running + cache) * costs.slot_bytes,
        kv_bytes=pages * costs.page_bytes,
        row_reserve_bytes=running * costs.row_bytes,
        cache_slots=cache,
        notes=tuple(notes),
    )
