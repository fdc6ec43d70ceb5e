"""One allocator over the paged KV pool and the state pool.

A running request holds one request slot s ∈ [1, max_running]: state slot s in the StatePool and
page-table row s - 1. It holds _num_pages(len, page_size) pages, grown as it decodes, within a page
budget reserved at admission, so a running request can never run out of pages mid-decode.
Slot 0 and the last table row (pointing at page 0) are dummies that padded batch entries use.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.kvcache.kv_pool import KVPool
from minisgl.kvcache.pages import _num_pages
from minisgl.kvcache.state_pool import StatePool

DUMMY_PAGE = 0
DUMMY_SLOT = 0


class PoolExhausted(RuntimeError):
    """Raised when an allocation is asked for that the free pool cannot cover."""


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


@dataclass(frozen=True)
class PoolConfig:
    max_running_requests: int
    max_seq_len: int
    page_size: int = 64
    num_pages: int | None = None  # usable pages; None = enough for every slot at max_seq_len
    ssm_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
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
    def pages_per_request(self) -> int:
        return _num_pages(self.max_seq_len, self.page_size)

    @property
    def usable_pages(self) -> int:
        return self.num_pages if self.num_pages is not None else self.max_running_requests * self.pages_per_request


class HybridPool:
    def __init__(self, layout: PoolLayout, cfg: PoolConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.max_running = cfg.max_running_requests
        total_pages = cfg.usable_pages + 1  # + the dummy page 0
        self.kv: KVPool | None = None
        if layout.full_layers:
            self.kv = KVPool(
                layout.full_layers, total_pages, cfg.page_size, layout.num_kv_heads, layout.head_dim, dtype, device
            )
        self.state: StatePool | None = None
        if layout.linear_layers:
            self.state = StatePool(
                layout.linear_layers,
                self.max_running,
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
            (self.max_running + 1, cfg.pages_per_request), DUMMY_PAGE, dtype=torch.int32, device=device
        )
        self.dummy_row = self.max_running
        # Pop from the end: low ids first keeps allocation deterministic across runs.
        self._free_pages = list(range(total_pages - 1, DUMMY_PAGE, -1))
        self._free_slots = list(range(self.max_running, DUMMY_SLOT, -1))
        self._pages: dict[int, list[int]] = {}
        self._reserved: dict[int, int] = {}

    # -- queries --------------------------------------------------------------------------------
    @property
    def total_pages(self) -> int:
        return self.cfg.usable_pages

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def used_slots(self) -> int:
        return len(self._pages)

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def available_pages(self) -> int:
        """Free pages not already promised to running requests."""
        outstanding = sum(self._reserved[s] - len(p) for s, p in self._pages.items())
        return len(self._free_pages) - outstanding

    @staticmethod
    def row(slot: int) -> int:
        return slot - 1

    def can_allocate(self, reserve_tokens: int) -> bool:
        return bool(self._free_slots) and _num_pages(reserve_tokens, self.page_size) <= self.available_pages

    # -- allocation -----------------------------------------------------------------------------
    def allocate(self, reserve_tokens: int) -> int:
        """Take a slot with zeroed state and reserve pages for up to `reserve_tokens` tokens."""
        if reserve_tokens > self.cfg.max_seq_len:
            raise PoolExhausted(f"a request of {reserve_tokens} tokens exceeds max_seq_len={self.cfg.max_seq_len}")
        if not self._free_slots:
            raise PoolExhausted(f"no free request slot (all {self.max_running} in use)")
        need = _num_pages(reserve_tokens, self.page_size)
        if need > self.available_pages:
            raise PoolExhausted(f"{need} pages needed, {self.available_pages} available")
        slot = self._free_slots.pop()
        self._pages[slot] = []
        self._reserved[slot] = need
        if self.state is not None:
            self.state.reset(slot)
        return slot

    def ensure_tokens(self, slot: int, tokens: int) -> None:
        """Grow the slot's pages so that `tokens` tokens fit, within its reservation."""
        pages = self._pages[slot]
        need = _num_pages(tokens, self.page_size)
        if need > self._reserved[slot]:
            raise PoolExhausted(
                f"slot {slot} needs {need} pages for {tokens} tokens but reserved {self._reserved[slot]}"
            )
        if need <= len(pages):
            return
        new = [self._free_pages.pop() for _ in range(need - len(pages))]
        start = len(pages)
        pages.extend(new)
        self.page_table[self.row(slot), start:need] = torch.tensor(new, dtype=torch.int32)

    def free(self, slot: int) -> None:
        pages = self._pages.pop(slot)
        del self._reserved[slot]
        self._free_pages.extend(reversed(pages))
        self.page_table[self.row(slot)].fill_(DUMMY_PAGE)
        self._free_slots.append(slot)

    def check_integrity(self) -> None:
        """free + used == total, for pages and for slots, with no page or slot held twice."""
        held = [p for pages in self._pages.values() for p in pages]
        all_pages = held + self._free_pages
        if len(all_pages) != self.total_pages or set(all_pages) != set(range(1, self.total_pages + 1)):
            raise AssertionError(
                f"page pool corrupt: {len(self._free_pages)} free + {len(held)} held != {self.total_pages} total "
                f"(or duplicates)"
            )
        slots = list(self._pages) + self._free_slots
        if len(slots) != self.max_running or set(slots) != set(range(1, self.max_running + 1)):
            raise AssertionError(
                f"slot pool corrupt: {len(self._free_slots)} free + {len(self._pages)} used != {self.max_running}"
            )
        for slot in self._free_slots:
            if bool((self.page_table[self.row(slot)] != DUMMY_PAGE).any()):
                raise AssertionError(f"free slot {slot} still has pages in its table row")
