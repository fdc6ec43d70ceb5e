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
- slots: --max-running-requests when given; else, for models with GDN layers, the state gets
  ratio / (1 + ratio) of the pool (--mamba-full-memory-ratio, SGLang's flag and default, 0.9), and
  for models without, as many requests of SIZING_TOKENS tokens as fit (at most MAX_AUTO_RUNNING
  either way); slots are lowered only when they would leave no room for one request at the
  context length;
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
    notes: tuple[str, ...] = ()  # what was lowered or chosen, for the log

    def max_concurrency(self, tokens: int, page_size: int) -> int:
        return min(self.max_running_requests, self.num_pages // _num_pages(tokens, page_size))

    def config(self, flags: PoolConfig) -> PoolConfig:
        """The pool the flags asked for (page size, state dtype), at the planned sizes."""
        return replace(flags, max_running_requests=self.max_running_requests, max_seq_len=self.max_seq_len,
                       num_pages=self.num_pages)


def plan_pool(
    costs: PoolCosts,
    usable: int,
    model_max_len: int,
    context_length: int | None,
    max_running_requests: int | None,
    state_ratio: float = DEFAULT_STATE_RATIO,
) -> PoolPlan:
    """Slots and pages out of `usable` bytes (MemoryBudget.usable), by the rules above."""
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
    if max_running_requests is None and costs.slot_bytes:
        share = state_ratio / (1 + state_ratio)
        slots = max(1, min(MAX_AUTO_RUNNING, int(usable * share) // costs.slot_bytes))
        notes.append(f"{slots} slots: {share:.0%} of the pool for state (--mamba-full-memory-ratio {state_ratio})")
    elif max_running_requests is None:
        sizing = min(floor_len, SIZING_TOKENS)
        slots = max(1, min(MAX_AUTO_RUNNING, usable // costs.request(sizing)))
        notes.append(f"{slots} slots: as many requests of {sizing} tokens as fit")
    else:
        slots = max_running_requests
    floor_pages = _num_pages(floor_len, costs.page_size)
    if slots * slot_cost + floor_pages * costs.page_bytes > usable:
        lowered = (usable - floor_pages * costs.page_bytes) // slot_cost
        notes.append(f"max_running_requests lowered from {slots} to {lowered}: more slots would leave no "
                     f"room for one request of {floor_len} tokens")
        slots = lowered
    pages = (usable - slots * slot_cost) // costs.page_bytes
    if context_length is not None:
        wanted = slots * _num_pages(context_length, costs.page_size)
        if pages < wanted:
            notes.append(f"KV pages lowered to {pages}: {slots} requests of {context_length} tokens would need {wanted}")
        pages = min(pages, wanted)
        seq_len = context_length
    else:
        seq_len = min(model_max_len, pages * costs.page_size)
        notes.append(f"context {seq_len} tokens (the model allows {model_max_len}; no --context-length given)")
    return PoolPlan(
        max_running_requests=slots,
        num_pages=pages,
        max_seq_len=seq_len,
        state_bytes=slots * costs.slot_bytes,
        kv_bytes=pages * costs.page_bytes,
        row_reserve_bytes=slots * costs.row_bytes,
        notes=tuple(notes),
    )
