"""Slot and page bookkeeping, without any tensors.

A running request holds one request slot s ∈ [1, max_running] and the pages that cover its length,
grown as it decodes within a page budget reserved at admission, so it never runs out mid-decode.
The colocated HybridPool uses it next to its tensors; the AFD coordinator uses it alone, for each
attention worker's lane, and ships the resulting page assignments in the step plans.
"""
from __future__ import annotations

from minisgl.kvcache.pages import _num_pages

DUMMY_PAGE = 0
DUMMY_SLOT = 0


class PoolExhausted(RuntimeError):
    """Raised when an allocation is asked for that the free pool cannot cover."""


class PoolAllocator:
    def __init__(self, max_running: int, total_pages: int, page_size: int, max_seq_len: int) -> None:
        self.max_running = max_running
        self.total_pages = total_pages
        self.page_size = page_size
        self.max_seq_len = max_seq_len
        # Pop from the end: low ids first keeps allocation deterministic across runs.
        self._free_pages = list(range(total_pages, DUMMY_PAGE, -1))
        self._free_slots = list(range(max_running, DUMMY_SLOT, -1))
        self._pages: dict[int, list[int]] = {}
        self._reserved: dict[int, int] = {}
        self._reserved_total = 0  # sum of _reserved: admission checks read it every step, at hundreds of slots

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def used_slots(self) -> int:
        return len(self._pages)

    def holds(self, slot: int) -> bool:
        """Whether `slot` belongs to a running request."""
        return slot in self._pages

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def available_pages(self) -> int:
        """Free pages not already promised to running requests: each slot holds at most what it
        reserved, and every page not free is held, so this is total - reserved."""
        return self.total_pages - self._reserved_total

    def can_allocate(self, reserve_tokens: int) -> bool:
        return bool(self._free_slots) and _num_pages(reserve_tokens, self.page_size) <= self.available_pages

    def allocate(self, reserve_tokens: int) -> int:
        """Take a slot and reserve pages for up to `reserve_tokens` tokens."""
        if reserve_tokens > self.max_seq_len:
            raise PoolExhausted(f"a request of {reserve_tokens} tokens exceeds max_seq_len={self.max_seq_len}")
        if not self._free_slots:
            raise PoolExhausted(f"no free request slot (all {self.max_running} in use)")
        need = _num_pages(reserve_tokens, self.page_size)
        if need > self.available_pages:
            raise PoolExhausted(f"{need} pages needed, {self.available_pages} available")
        slot = self._free_slots.pop()
        self._pages[slot] = []
        self._reserved[slot] = need
        self._reserved_total += need
        return slot

    def ensure_tokens(self, slot: int, tokens: int) -> tuple[int, list[int]]:
        """Grow the slot's pages so `tokens` tokens fit; returns (index of the first new page, new pages)."""
        pages = self._pages[slot]
        need = _num_pages(tokens, self.page_size)
        if need > self._reserved[slot]:
            raise PoolExhausted(
                f"slot {slot} needs {need} pages for {tokens} tokens but reserved {self._reserved[slot]}"
            )
        start = len(pages)
        new = [self._free_pages.pop() for _ in range(max(0, need - start))]
        pages.extend(new)
        return start, new

    def free(self, slot: int) -> None:
        pages = self._pages.pop(slot)
        self._reserved_total -= self._reserved.pop(slot)
        self._free_pages.extend(reversed(pages))
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
        if any(len(pages) > self._reserved[s] for s, pages in self._pages.items()):
            raise AssertionError("a slot holds more pages than it reserved")
        if self._reserved_total != sum(self._reserved.values()):
            raise AssertionError(f"reserved pages miscounted: {self._reserved_total} != {sum(self._reserved.values())}")
        slots = list(self._pages) + self._free_slots
        if len(slots) != self.max_running or set(slots) != set(range(1, self.max_running + 1)):
            raise AssertionError(
                f"slot pool corrupt: {len(self._free_slots)} free + {len(self._pages)} used != {self.max_running}"
            )
