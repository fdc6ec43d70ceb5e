"""Which cached token sequence a new prompt starts with: entries found by a chain of page hashes,
verified token by token, least recently used first out.

A hybrid model's recurrent state exists only where a forward stopped, so a sequence is cached at
one length (its entry), not at every page as an attention-only radix tree would: a prompt reuses
the longest entry it starts with. Two kinds:
- a prefix: whole pages, shared by every prompt that starts with it (each gets a copy of its state);
- a parked sequence: all a finished request fed (its last page may be partial), taken over whole
  by the one prompt that continues it (the next call of an agent), which writes on into that page.

It also remembers the first pages of recent prompts (a prompt whose beginning no other shares is
not worth a step to cache a prefix of) and the prefixes running requests are about to cache
(prompts that start with one wait for it).
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, Sequence


# First pages of prompts remembered (note): a few minutes of a busy server's arrivals.
RECENT_HEADS = 4096


@dataclass(frozen=True, eq=False)  # identity: two entries are never one
class PrefixEntry:
    tokens: tuple[int, ...]
    pages: tuple[int, ...]  # the K/V pages that hold them
    slot: int  # the state slot that holds the recurrent state after them
    parked: bool = False  # taken over by the prompt that matches it (else shared)


def page_hashes(tokens: Sequence[int], page_size: int, pages: int) -> Iterator[int]:
    """The hash of each of the first `pages` pages of `tokens` chained with those before it, from the
    empty chain's 0: equal hashes at page k mean (but for collisions) equal first k pages."""
    h = 0
    yield h
    for k in range(pages):
        h = hash((h, tuple(tokens[k * page_size : (k + 1) * page_size])))
        yield h


def _head(prompt: Sequence[int], page_size: int) -> int | None:
    """A prompt's first page, hashed; None for a prompt of a page or less (it shares no whole page
    and still has a token to feed)."""
    return hash(tuple(prompt[:page_size])) if len(prompt) > page_size else None


class PrefixIndex:
    """Entries by (their whole pages, the chained hash of those pages)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._buckets: dict[tuple[int, int], list[PrefixEntry]] = {}
        self._used: dict[PrefixEntry, int] = {}  # entry -> clock of its insert or last hit
        self._clock = itertools.count()
        self._expected: dict[tuple[int, int], int] = {}  # key -> running requests about to cache it
        self._heads: OrderedDict[int, int] = OrderedDict()  # a recent prompts' first page -> how many, newest last

    def __len__(self) -> int:
        return len(self._used)

    def entries(self) -> list[PrefixEntry]:
        return list(self._used)

    def _key(self, tokens: Sequence[int]) -> tuple[int, int]:
        pages = len(tokens) // self.page_size
        *_, h = page_hashes(tokens, self.page_size, pages)
        return pages, h

    def match(self, prompt: Sequence[int]) -> PrefixEntry | None:
        """The longest entry `prompt` starts with that leaves it at least one token to feed (the
        step that samples its first output needs one), marked as used."""
        if not self._used:
            return None
        most = (len(prompt) - 1) // self.page_size
        for pages, h in reversed(list(enumerate(page_hashes(prompt, self.page_size, most)))):
            for entry in self._buckets.get((pages, h), ()):  # longest first
                n = len(entry.tokens)
                if n < len(prompt) and list(entry.tokens) == list(prompt[:n]):
                    self._used[entry] = next(self._clock)
                    return entry
        return None

    def insert(self, entry: PrefixEntry) -> bool:
        """Index `entry`; False (and nothing changed) where the same tokens are cached already."""
        pages, rest = divmod(len(entry.tokens), self.page_size)
        if not entry.tokens or (rest and not entry.parked):
            raise ValueError(f"a shared prefix holds whole pages, not {len(entry.tokens)} tokens")
        if len(entry.pages) != pages + bool(rest):
            raise ValueError(f"{len(entry.tokens)} tokens in {len(entry.pages)} pages of {self.page_size}")
        bucket = self._buckets.setdefault(self._key(entry.tokens), [])
        if any(e.tokens == entry.tokens for e in bucket):
            return False
        bucket.append(entry)
        bucket.sort(key=lambda e: -len(e.tokens))
        self._used[entry] = next(self._clock)
        return True

    def note(self, prompt: Sequence[int]) -> None:
        """Remember that `prompt` arrived (its first page, among the last RECENT_HEADS first pages)."""
        if (head := _head(prompt, self.page_size)) is not None:
            self._heads[head] = self._heads.get(head, 0) + 1
            self._heads.move_to_end(head)
            if len(self._heads) > RECENT_HEADS:
                self._heads.popitem(last=False)

    def head_shared(self, prompt: Sequence[int]) -> bool:
        """Whether another recent prompt began with the same page as `prompt` (noted): one that shares
        nothing with them (a random benchmark's) would pay a prefill step to cache what no one reuses."""
        return self._heads.get(_head(prompt, self.page_size), 0) > 1

    def expect(self, tokens: Sequence[int]) -> tuple[int, int]:
        """A running request will cache `tokens` (a shared prefix) once its prefill gets there; the
        key to settle() when it has or never will."""
        key = self._key(tokens)
        self._expected[key] = self._expected.get(key, 0) + 1
        return key

    def settle(self, key: tuple[int, int]) -> None:
        if (left := self._expected[key] - 1) > 0:
            self._expected[key] = left
        else:
            del self._expected[key]

    def awaited(self, prompt: Sequence[int]) -> bool:
        """Whether a running request is about to cache a prefix of `prompt` (but for hash collisions)."""
        if not self._expected:
            return False
        most = (len(prompt) - 1) // self.page_size
        return any(key in self._expected for key in enumerate(page_hashes(prompt, self.page_size, most)))

    def remove(self, entry: PrefixEntry) -> None:
        key = self._key(entry.tokens)
        self._buckets[key].remove(entry)
        if not self._buckets[key]:
            del self._buckets[key]
        del self._used[entry]

    def pop_least_recent(self) -> PrefixEntry | None:
        """The entry to evict: the least recently used parked sequence, else the least recently used
        shared prefix. A parked sequence serves one continuation, a shared prefix every prompt that
        starts with it (as a radix tree evicts its leaves before the prefixes they extend)."""
        if not self._used:
            return None
        parked = [e for e in self._used if e.parked]
        entry = min(parked or self._used, key=self._used.__getitem__)
        self.remove(entry)
        return entry
