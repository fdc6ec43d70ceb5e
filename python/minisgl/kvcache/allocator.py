"""Slot and page bookkeeping, without any tensors.

A running request holds one request slot s ∈ [1, num_slots] and the pages that cover its length,
grown as it decodes within a page budget reserved at admission, so it never runs out mid-decode. At
most max_running requests run at once; the cache_slots beyond them are the prefix cache's alone.
The colocated HybridPool uses it next to its tensors; the AFD coordinator uses it alone, for each
attention worker's lane, and ships the resulting page assignments in the step plans.

With the prefix cache, idle slots and pages keep what earlier requests fed (prefix_index.py): a
shared prefix (whole pages, and a slot with the recurrent state after them), whose pages a new
request that starts with it borrows, with a copy of its state; or a finished request's parked
sequence, whose slot and pages the one request that continues it takes over. Entries are
evicted when a slot or a page is wanted (parked ones first, then chat tails their next turn has
left behind, then tails waiting for theirs, then shared prefixes, least recently used first in
each): pages held by entries alone count as available, so admission never waits on the cache.
Running requests leave at least cache_slots slots to entries, so a shared prefix stays cached
while every running slot is busy.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from minisgl.kvcache.pages import _num_pages
from minisgl.kvcache.prefix_index import PrefixEntry, PrefixIndex

DUMMY_PAGE = 0
DUMMY_SLOT = 0
# A prefix is cached at least this many tokens before its prompt's end: a chat template renders an
# earlier turn's generation prompt differently in the next turn's history (Qwen3.5 leaves out the
# `<think>` it opened with), so the next prompt shares the earlier one up to a few tokens before its end.
CHECKPOINT_TAIL = 16


@dataclass(frozen=True)
class Admission:
    """Where a request starts in the pool."""

    slot: int
    cached: int = 0  # prompt tokens it reuses from the cache
    checkpoints: tuple[int, ...] = ()  # prompt lengths to cache the prefix (and state) of, ascending


class PoolExhausted(RuntimeError):
    """Raised when an allocation is asked for that the free pool cannot cover."""


class PoolAllocator:
    def __init__(self, max_running: int, total_pages: int, page_size: int, max_seq_len: int,
                 prefix_cache: bool = False, cache_slots: int = 0) -> None:
        if cache_slots and not prefix_cache:
            raise ValueError("cache_slots are for the prefix cache, which is off")
        self.max_running = max_running
        self.num_slots = max_running + cache_slots
        self.total_pages = total_pages
        self.page_size = page_size
        self.max_seq_len = max_seq_len
        # Pop from the end: low ids first keeps allocation deterministic across runs.
        self._free_pages = list(range(total_pages, DUMMY_PAGE, -1))
        self._free_slots = list(range(self.num_slots, DUMMY_SLOT, -1))
        self._pages: dict[int, list[int]] = {}  # running slot -> its pages, those an entry lent it first
        self._borrowed: dict[int, int] = {}  # running slot -> how many of its first pages are lent
        self._reserved: dict[int, int] = {}  # running slot -> pages of its own it may take
        # Reserved pages not yet taken, summed: admission checks it every step, at hundreds of slots.
        self._untaken = 0
        self._slot_refs: dict[int, int] = {}  # page -> running slots holding it
        self._entry_refs: dict[int, int] = {}  # page -> cache entries holding it
        self._cache_only = 0  # pages held by entries alone: freed by evicting them
        self.cache: PrefixIndex | None = PrefixIndex(page_size) if prefix_cache else None
        # running slot -> the prefixes it will cache (index keys) -> whether prompts branch there
        self._expects: dict[int, dict[tuple[int, int], bool]] = {}

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def used_slots(self) -> int:
        return len(self._pages)

    @property
    def cached_prefixes(self) -> int:
        return len(self.cache) if self.cache is not None else 0

    def holds(self, slot: int) -> bool:
        """Whether `slot` belongs to a running request."""
        return slot in self._pages

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def evictable_pages(self) -> int:
        """Pages only the prefix cache holds."""
        return self._cache_only

    @property
    def available_pages(self) -> int:
        """Pages not already promised to running requests: free ones and those only the cache holds,
        less what running requests reserved and have not taken (without the cache: total - reserved)."""
        return len(self._free_pages) + self._cache_only - self._untaken

    def can_allocate(self, reserve_tokens: int) -> bool:
        # Below max_running, a slot is free or held by an entry (evictable): num_slots > running.
        return self.used_slots < self.max_running and _num_pages(reserve_tokens, self.page_size) <= self.available_pages

    def allocate(self, reserve_tokens: int) -> int:
        """Take a slot and reserve pages for up to `reserve_tokens` tokens."""
        return self.admit((), reserve_tokens, reuse=False).slot

    def admit(self, prompt: Sequence[int], reserve_tokens: int, reuse: bool, chat_turn: bool = False) -> Admission:
        """allocate(), starting from the longest cached prefix of `prompt` where `reuse` (which also
        allows caching its own; a `chat_turn` near its end too, for the next turn). (The AFD lanes'
        allocators keep no cache: nothing reused.)"""
        return self.admit_entry(prompt, reserve_tokens, reuse, chat_turn)[0]

    def admit_entry(self, prompt: Sequence[int], reserve_tokens: int, reuse: bool,
                    chat_turn: bool = False) -> tuple[Admission, PrefixEntry | None]:
        """admit(), and the entry whose pages the slot borrowed (its state is the caller's to copy)."""
        if reserve_tokens > self.max_seq_len:
            raise PoolExhausted(f"a request of {reserve_tokens} tokens exceeds max_seq_len={self.max_seq_len}")
        if self.used_slots >= self.max_running:
            raise PoolExhausted(f"no free request slot (all {self.max_running} in use)")
        need = _num_pages(reserve_tokens, self.page_size)
        if need > self.available_pages:
            raise PoolExhausted(f"{need} pages needed, {self.available_pages} available")
        entry = self.cache.match(prompt) if reuse and self.cache is not None else None
        lent = list(entry.pages) if entry is not None else []
        for page in lent:  # held before a slot is taken: that may evict the entry itself
            self._hold(page, by_slot=True)
        if entry is not None and entry.parked:  # taken over: its slot and pages become the request's
            self.cache.remove(entry)
            for page in lent:
                self._drop(page, by_slot=False)
            slot = entry.slot
        else:
            slot = self._take_slot()
        self._pages[slot] = lent
        self._borrowed[slot] = len(lent)
        self._reserved[slot] = need - len(lent)
        self._untaken += need - len(lent)
        cached = len(entry.tokens) if entry is not None else 0
        # A prompt that continues a parked sequence is parked in turn when it finishes, for the call
        # that continues it: a prefix of it cached as well would only take a slot.
        continues = entry is not None and entry.parked
        follows = entry is not None and self.cache.taken_once(entry)
        points = self._checkpoints(prompt, cached, chat_turn, follows) if reuse and not continues else {}
        if points:
            self._expects[slot] = {self.cache.expect(prompt[:at]): shared for at, shared in points.items()}
        return Admission(slot, cached, tuple(sorted(points))), entry

    def note_prompt(self, prompt: Sequence[int]) -> None:
        """A request with this prompt arrived (queued): whether prompts share their beginnings decides
        which ones cache a prefix of theirs (admit)."""
        if self.cache is not None:
            self.cache.note(prompt)

    def prompt_keys(self, prompt: Sequence[int]) -> list[tuple[int, int]]:
        """The cache's lookup keys of `prompt` (none without the cache), for cached_len."""
        return self.cache.prompt_keys(prompt) if self.cache is not None else []

    def cached_len(self, prompt: Sequence[int], keys: list[tuple[int, int]]) -> int:
        """Prompt tokens admit() would reuse now; `keys`: prompt_keys(prompt)."""
        return self.cache.longest(prompt, keys) if self.cache is not None else 0

    def awaits_prefix(self, prompt: Sequence[int]) -> bool:
        """Whether a running request is about to cache a prefix of `prompt`: admitting it a step or
        two later reuses that prefix (the samples of an n > 1 request, the same prompt sent again)
        instead of computing it once more."""
        return self.cache is not None and self.cache.awaited(prompt)

    def _settle(self, slot: int, tokens: Sequence[int] | None = None) -> bool:
        """The slot has cached `tokens` or given up on it (None: on all it expected to cache);
        whether recent prompts branch after `tokens`."""
        keys = self._expects.get(slot, {})
        settled = list(keys) if tokens is None else [key for key in [self.cache.key(tokens)] if key in keys]
        shared = False
        for key in settled:
            shared = keys.pop(key)
            self.cache.settle(key)
        if not keys:
            self._expects.pop(slot, None)
        return shared

    def _checkpoints(self, prompt: Sequence[int], cached: int, chat_turn: bool,
                     follows: bool = False) -> dict[int, bool]:
        """The prompt lengths at which a new request's prefix should be cached (and whether recent
        prompts branch there), past what it reused, while a slot could hold an entry (the step
        that passes each writes the state there to the entry's slot: forward_batch.Snapshot); only
        for a chat turn, a prompt that reused a prefix, or one that shares whole pages with another
        recent prompt that goes on differently (nothing suggests a raw prompt like no other is shared):
        - where it parts from that prompt (the end of a system prompt many users' prompts begin
          with, cached by the second of them), no later than the tail below;
        - for a chat turn, also the last page boundary at least CHECKPOINT_TAIL tokens before its
          end (the tail): the prefix the next turn of its conversation starts with. Other prompts
          cache none there: raw prompts that continue a finished one do so exactly (parked).
        `follows`: what it reused is a chat turn's tail it was the first to reuse, so most likely it
        is that turn's next one. It parts from that turn where the template re-rendered its end,
        fewer than page_size + CHECKPOINT_TAIL tokens past the tail: a branch there is no prefix
        another prompt will reuse (the turn after this one reuses this one's tail)."""
        if self.cache is None or not (self._free_slots or self.cached_prefixes):
            return {}
        shared = self.cache.shared_pages(prompt) * self.page_size
        if not (shared or cached or chat_turn):
            return {}
        tail = (len(prompt) - CHECKPOINT_TAIL) // self.page_size * self.page_size
        if follows and shared < cached + self.page_size + CHECKPOINT_TAIL:
            shared = 0
        points = {min(shared, tail): True} if shared else {}
        if chat_turn and (self._free_slots or self.cache.evictable(proven=False)):  # a tail evicts no shared prefix
            points.setdefault(tail, False)
        return {at: s for at, s in points.items() if at > cached}

    def cache_prefix(self, slot: int, tokens: Sequence[int]) -> PrefixEntry | None:
        """Keep the first len(tokens) tokens (whole pages) of running `slot` as an entry: its pages
        are shared, its state goes to a slot of the entry's own (the caller copies it). None where
        the prefix is cached already or no slot is to be had (a prefix no other recent prompt
        shares evicts no prefix prompts share)."""
        if self.cache is None:
            return None
        shared = self._settle(slot, tokens)
        if self.cache.holds(tokens) or not (self._free_slots or self._evict_one(proven=shared)):
            return None
        pages = tuple(self._pages[slot][: len(tokens) // self.page_size])
        entry = PrefixEntry(tuple(tokens), pages, self._free_slots.pop())
        self.cache.insert(entry, proven=shared)
        for page in pages:
            self._hold(page, by_slot=False)
        return entry

    def park(self, slot: int, tokens: Sequence[int]) -> PrefixEntry | None:
        """End running `slot`, keeping what it fed (`tokens`, its state in the slot) for the prompt
        that continues it: the slot and the pages that hold the tokens become a parked entry, the
        rest of its pages go back. None (nothing changed) without the cache or where the same
        tokens are cached already: the caller frees the slot."""
        if self.cache is None or not tokens:
            return None
        entry = PrefixEntry(tuple(tokens), tuple(self._pages[slot][: _num_pages(len(tokens), self.page_size)]), slot,
                            parked=True)
        if not self.cache.insert(entry):
            return None
        for page in entry.pages:
            self._hold(page, by_slot=False)
        self._release_running(slot)
        return entry

    def ensure_tokens(self, slot: int, tokens: int) -> tuple[int, list[int]]:
        """Grow the slot's pages so `tokens` tokens fit; returns (index of the first new page, new pages)."""
        pages = self._pages[slot]
        need = _num_pages(tokens, self.page_size)
        if need - self._borrowed[slot] > self._reserved[slot]:
            raise PoolExhausted(
                f"slot {slot} needs {need} pages for {tokens} tokens but reserved {self._reserved[slot]} "
                f"beside {self._borrowed[slot]} lent"
            )
        start = len(pages)
        new = [self._take_page() for _ in range(max(0, need - start))]
        pages.extend(new)
        self._untaken -= len(new)
        return start, new

    def free(self, slot: int) -> None:
        self._release_running(slot)
        self._free_slots.append(slot)

    def _release_running(self, slot: int) -> None:
        """The slot no longer runs a request: its reservation ends and its pages lose its hold."""
        self._settle(slot)
        pages = self._pages.pop(slot)
        borrowed = self._borrowed.pop(slot)
        self._untaken -= self._reserved.pop(slot) - (len(pages) - borrowed)
        for page in reversed(pages):
            self._drop(page, by_slot=True)

    def flush_cache(self) -> int:
        """Evict every cached prefix (their pages and slots go back unless running requests hold
        them); returns how many there were."""
        n = self.cached_prefixes
        while self._evict_one():
            pass
        return n

    # -- pages and slots, with the cache's holds -------------------------------------------------
    def _cache_holds_alone(self, page: int) -> bool:
        return page in self._entry_refs and page not in self._slot_refs

    def _count(self, page: int, by_slot: bool, delta: int) -> None:
        """Add `delta` to the page's holds by running slots or by entries; a page no one holds is free."""
        refs = self._slot_refs if by_slot else self._entry_refs
        alone = self._cache_holds_alone(page)
        if n := refs.get(page, 0) + delta:
            refs[page] = n
        else:
            del refs[page]
        self._cache_only += self._cache_holds_alone(page) - alone
        if page not in self._slot_refs and page not in self._entry_refs:
            self._free_pages.append(page)

    def _hold(self, page: int, by_slot: bool) -> None:
        self._count(page, by_slot, 1)

    def _drop(self, page: int, by_slot: bool) -> None:
        self._count(page, by_slot, -1)

    def _take_page(self) -> int:
        while not self._free_pages:
            if not self._evict_one():
                raise PoolExhausted("no free page and no cached prefix to evict")
        page = self._free_pages.pop()
        self._slot_refs[page] = 1
        return page

    def _take_slot(self) -> int:
        if not self._free_slots and not self._evict_one():
            raise PoolExhausted(f"no free request slot (all {self.num_slots} held)")
        return self._free_slots.pop()

    def _evict_one(self, proven: bool = True) -> bool:
        """Evict the entry pop_least_recent(proven) names, if any."""
        entry = self.cache.pop_least_recent(proven) if self.cache is not None else None
        if entry is None:
            return False
        for page in entry.pages:
            self._drop(page, by_slot=False)
        self._free_slots.append(entry.slot)
        return True

    def check_integrity(self) -> None:
        """Every page free or held, and its holds counted right; running slots, entries' slots and
        free slots partition the slots; reservations and their sums agree."""
        slot_refs: dict[int, int] = {}
        entry_refs: dict[int, int] = {}
        entries = self.cache.entries() if self.cache is not None else []
        for pages in self._pages.values():
            for p in pages:
                slot_refs[p] = slot_refs.get(p, 0) + 1
        for entry in entries:
            for p in entry.pages:
                entry_refs[p] = entry_refs.get(p, 0) + 1
        held = set(slot_refs) | set(entry_refs)
        if (len(self._free_pages) != len(set(self._free_pages)) or held & set(self._free_pages)
                or held | set(self._free_pages) != set(range(1, self.total_pages + 1))):
            raise AssertionError(
                f"page pool corrupt: {len(self._free_pages)} free + {len(held)} held != {self.total_pages} total "
                f"(or duplicates)"
            )
        if slot_refs != self._slot_refs or entry_refs != self._entry_refs:
            raise AssertionError("page holds miscounted")
        if self._cache_only != len(set(entry_refs) - set(slot_refs)):
            raise AssertionError("pages held by the cache alone miscounted")
        untaken = 0
        for s, pages in self._pages.items():
            own = len(pages) - self._borrowed[s]
            if own > self._reserved[s]:
                raise AssertionError("a slot holds more pages than it reserved")
            untaken += self._reserved[s] - own
        if untaken != self._untaken:
            raise AssertionError(f"reserved pages miscounted: {self._untaken} != {untaken}")
        expected = self.cache._expected if self.cache is not None else {}
        expects = Counter(key for keys in self._expects.values() for key in keys)
        if not set(self._expects) <= set(self._pages) or expects != Counter(expected):
            raise AssertionError("the prefixes running requests will cache are miscounted")
        slots = list(self._pages) + [e.slot for e in entries] + self._free_slots
        if len(slots) != self.num_slots or set(slots) != set(range(1, self.num_slots + 1)):
            raise AssertionError(
                f"slot pool corrupt: {len(self._free_slots)} free + {len(self._pages)} used + {len(entries)} "
                f"cached != {self.num_slots}"
            )
        if len(self._pages) > self.max_running:
            raise AssertionError(f"{len(self._pages)} requests run, more than max_running={self.max_running}")
