"""The hybrid pool: paged KV for the full-attention layers and state slots for the GDN layers.

Request slot s ∈ [1, num_slots] owns state slot s and page-table row s - 1: max_running_requests
running at once, and cache_slots more that only the prefix cache holds. Slot 0 and the last table
row (pointing at page 0) are dummies that padded batch entries use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from minisgl.host_copy import to_device
from minisgl.kvcache.allocator import DUMMY_PAGE, DUMMY_SLOT, Admission, PoolAllocator, PoolExhausted
from minisgl.kvcache.kv_pool import KVPool
from minisgl.kvcache.pages import _num_pages
from minisgl.kvcache.state_pool import StatePool

__all__ = ["DUMMY_PAGE", "DUMMY_SLOT", "HybridPool", "PoolConfig", "PoolExhausted", "PoolLayout"]


@dataclass(frozen=True)
class PoolLayout:
    """What the model needs stored: which layers hold KV and which hold recurrent state, and their dims."""

    full_layers: tuple[int, ...]
    num_kv_heads: int
    head_dim: int
    linear_layers: tuple[int, ...] = ()
    conv_dim: int = 0
    conv_kernel: int = 0
    num_value_heads: int = 0
    key_head_dim: int = 0
    value_head_dim: int = 0

    def kv_bytes_per_page(self, page_size: int, dtype: torch.dtype) -> int:
        """K and V of one page over all full-attention layers (what KVPool allocates per page)."""
        return 2 * len(self.full_layers) * page_size * self.num_kv_heads * self.head_dim * dtype.itemsize

    def state_bytes_per_slot(self, conv_dtype: torch.dtype, ssm_dtype: torch.dtype) -> int:
        """Conv and SSM state of one slot over all GDN layers (what StatePool allocates per slot)."""
        conv = self.conv_dim * (self.conv_kernel - 1) * conv_dtype.itemsize
        ssm = self.num_value_heads * self.key_head_dim * self.value_head_dim * ssm_dtype.itemsize
        return len(self.linear_layers) * (conv + ssm)


@dataclass(frozen=True)
class PoolConfig:
    max_running_requests: int
    max_seq_len: int
    page_size: int = 64
    num_pages: int | None = None  # usable pages; None = enough for every slot at max_seq_len
    ssm_dtype: str = "float32"
    kv_dtype: str | None = None  # torch's name; None: the activations' dtype
    prefix_cache: bool = False  # idle slots and pages keep what earlier requests fed (allocator.py)
    cache_slots: int = 0  # state slots beyond max_running_requests that only the prefix cache holds

    def __post_init__(self) -> None:
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.cache_slots < 0 or (self.cache_slots and not self.prefix_cache):
            raise ValueError(f"cache_slots must be >= 0, and 0 without the prefix cache, got {self.cache_slots}")
        if self.max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {self.max_seq_len}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.num_pages is not None and self.num_pages < _num_pages(self.max_seq_len, self.page_size):
            raise ValueError(
                f"num_pages={self.num_pages} cannot hold even one request of max_seq_len={self.max_seq_len} "
                f"at page_size={self.page_size}"
            )

    @property
    def num_slots(self) -> int:
        return self.max_running_requests + self.cache_slots

    @property
    def pages_per_request(self) -> int:
        return _num_pages(self.max_seq_len, self.page_size)

    def kv_torch_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The K/V cache's dtype for activations in `dtype`."""
        return getattr(torch, self.kv_dtype) if self.kv_dtype else dtype

    @property
    def usable_pages(self) -> int:
        return self.num_pages if self.num_pages is not None else self.max_running_requests * self.pages_per_request


class HybridPool:
    """The device storage (KV pages, state slots, page table) with a PoolAllocator's bookkeeping.

    On an AFD attention worker the bookkeeping lives in the coordinator instead; the worker applies
    the plan's assignments with `assign_pages`, `reset_slot` and `clear_slot`.
    """

    def __init__(self, layout: PoolLayout, cfg: PoolConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.max_running = cfg.max_running_requests
        self.num_slots = cfg.num_slots
        self.allocator = PoolAllocator(self.max_running, cfg.usable_pages, cfg.page_size, cfg.max_seq_len,
                                       cfg.prefix_cache, cfg.cache_slots)
        total_pages = cfg.usable_pages + 1  # + the dummy page 0
        self.kv: KVPool | None = None
        if layout.full_layers:
            self.kv = KVPool(layout.full_layers, total_pages, cfg.page_size, layout.num_kv_heads, layout.head_dim,
                             cfg.kv_torch_dtype(dtype), device)
        self.state: StatePool | None = None
        if layout.linear_layers:
            self.state = StatePool(
                layout.linear_layers,
                self.num_slots,
                layout.conv_dim,
                layout.conv_kernel,
                layout.num_value_heads,
                layout.key_head_dim,
                layout.value_head_dim,
                conv_dtype=dtype,
                ssm_dtype=getattr(torch, cfg.ssm_dtype),
                device=device,
            )
        self.page_table = torch.full(
            (self.num_slots + 1, cfg.pages_per_request), DUMMY_PAGE, dtype=torch.int32, device=device
        )
        self.dummy_row = self.num_slots

    @classmethod
    def scratch(
        cls, layout: PoolLayout, table_tokens: int, flags: PoolConfig, dtype: torch.dtype, device: torch.device | str,
    ) -> "HybridPool":
        """One slot and one page of the dtypes `flags` store, but a page table as wide as a pool for
        `table_tokens` tokens: for steps that touch only the dummy slot and row (warm-up and memory
        probes), so the kernels see the table stride they will see on the real pool."""
        page_size = flags.page_size
        pool = cls(layout, PoolConfig(1, page_size, page_size, ssm_dtype=flags.ssm_dtype, kv_dtype=flags.kv_dtype),
                   dtype, device)
        pool.page_table = torch.full(
            (2, _num_pages(table_tokens, page_size)), DUMMY_PAGE, dtype=torch.int32, device=device
        )
        return pool

    @property
    def total_pages(self) -> int:
        return self.allocator.total_pages

    @property
    def free_slots(self) -> int:
        return self.allocator.free_slots

    @property
    def used_slots(self) -> int:
        return self.allocator.used_slots

    @property
    def free_pages(self) -> int:
        return self.allocator.free_pages

    @property
    def evictable_pages(self) -> int:
        return self.allocator.evictable_pages

    @property
    def cached_prefixes(self) -> int:
        return self.allocator.cached_prefixes

    @property
    def available_pages(self) -> int:
        return self.allocator.available_pages

    @staticmethod
    def row(slot: int) -> int:
        return slot - 1

    # -- applying assignments to the device tables ---------------------------------------------
    def assign_pages(self, slot: int, start: int, pages: list[int]) -> None:
        if pages:
            self.page_table[self.row(slot), start : start + len(pages)] = to_device(pages, torch.int32, self.page_table.device)

    def reset_slot(self, slot: int) -> None:
        if self.state is not None:
            self.state.reset(slot)

    def clear_slot(self, slot: int) -> None:
        self.page_table[self.row(slot)].fill_(DUMMY_PAGE)

    def copy_state(self, src: int, dst: int) -> None:
        """Slot dst's recurrent state := slot src's (queued after the steps that wrote src)."""
        if self.state is not None:
            self.state.copy(src, dst)

    # -- allocation (colocated) -----------------------------------------------------------------
    def can_allocate(self, reserve_tokens: int) -> bool:
        return self.allocator.can_allocate(reserve_tokens)

    def allocate(self, reserve_tokens: int) -> int:
        """Take a slot with zeroed state and reserve pages for up to `reserve_tokens` tokens."""
        return self.admit((), reserve_tokens, reuse=False).slot

    def admit(self, prompt: Sequence[int], reserve_tokens: int, reuse: bool, chat_turn: bool = False) -> Admission:
        """allocator.admit: where `reuse` and the cache holds a prefix of `prompt`, the slot starts
        after it, with the prefix's pages in its table row and its state; else from zero state."""
        admission, entry = self.allocator.admit_entry(prompt, reserve_tokens, reuse, chat_turn)
        slot = admission.slot
        if entry is None:
            self.reset_slot(slot)
        else:
            self.assign_pages(slot, 0, list(entry.pages))
            if entry.slot != slot:  # else a parked entry taken over, or one evicted for this slot: the state is there
                self.copy_state(entry.slot, slot)
        return admission

    def cache_prefix(self, slot: int, tokens: Sequence[int]) -> bool:
        """Cache the first len(tokens) tokens of running `slot` (whole pages; call once a step that
        ends there is queued); False where nothing was cached."""
        entry = self.allocator.cache_prefix(slot, tokens)
        if entry is not None:
            self.copy_state(slot, entry.slot)
        return entry is not None

    def snapshot_prefix(self, slot: int, tokens: Sequence[int]) -> int | None:
        """Cache the first len(tokens) tokens of running `slot` (whole pages) from inside the step
        about to be queued, which computes them: it writes their state to the slot returned
        (forward_batch.Snapshot). None where nothing was cached."""
        entry = self.allocator.cache_prefix(slot, tokens)
        return None if entry is None else entry.slot

    def park(self, slot: int, tokens: Sequence[int]) -> bool:
        """End running `slot` keeping what it fed for the prompt that continues it (allocator.park);
        False where nothing was kept: then free() it."""
        if self.allocator.park(slot, tokens) is None:
            return False
        self.clear_slot(slot)  # its table row is a running slot's; the taker's pages are assigned anew
        return True

    def note_prompt(self, prompt: Sequence[int]) -> None:
        self.allocator.note_prompt(prompt)

    def prompt_keys(self, prompt: Sequence[int]) -> list[tuple[int, int]]:
        return self.allocator.prompt_keys(prompt)

    def cached_len(self, prompt: Sequence[int], keys: list[tuple[int, int]]) -> int:
        return self.allocator.cached_len(prompt, keys)

    def awaits_prefix(self, prompt: Sequence[int]) -> bool:
        return self.allocator.awaits_prefix(prompt)

    def flush_cache(self) -> int:
        return self.allocator.flush_cache()

    def ensure_tokens(self, slot: int, tokens: int) -> None:
        """Grow the slot's pages so that `tokens` tokens fit, within its reservation."""
        self.assign_pages(slot, *self.allocator.ensure_tokens(slot, tokens))

    def free(self, slot: int) -> None:
        self.allocator.free(slot)
        self.clear_slot(slot)

    def check_integrity(self) -> None:
        """free + used == total for pages and slots, and no free slot keeps pages in its table row."""
        self.allocator.check_integrity()
        for slot in range(1, self.num_slots + 1):
            if not self.allocator.holds(slot) and bool((self.page_table[self.row(slot)] != DUMMY_PAGE).any()):
                raise AssertionError(f"free slot {slot} still has pages in its table row")
