"""Which cached prompt prefix a new prompt starts with: token sequences of whole pages, found by a
chain of page hashes, verified token by token, least recently used first out.

A hybrid model's recurrent state exists only where a forward stopped, so a prefix is cached at one
length (its entry), not at every page as an attention-only radix tree would: a prompt reuses the
longest entry it starts with.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator, Sequence


@dataclass(frozen=True)
class PrefixEntry:
    tokens: tuple[int, ...]  # a whole number of pages
    pages: tuple[int, ...]  # the K/V pages that hold them
    slot: int  # the state slot that holds the recurrent state after them


def page_hashes(tokens: Sequence[int], page_size: int, pages: int) -> Iterator[int]:
    """The hash of each of the first `pages` pages of `tokens` chained with those before it: equal
    hashes at page k mean (but for collisions) equal first k pages."""
    h = 0
    for k in range(pages):
        h = hash((h, tuple(tokens[k * page_size : (k + 1) * page_size])))
        yield h


class PrefixIndex:
    """Entries by (their page count, the chained hash of their pages); one entry per prefix."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._entries: dict[tuple[int, int], PrefixEntry] = {}
        self._used: dict[tuple[int, int], int] = {}  # key -> clock of its last insert or hit
        self._clock = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[PrefixEntry]:
        return list(self._entries.values())

    def _key(self, tokens: Sequence[int], pages: int) -> tuple[int, int]:
        *_, h = page_hashes(tokens, self.page_size, pages)
        return pages, h

    def match(self, prompt: Sequence[int]) -> PrefixEntry | None:
        """The longest entry `prompt` starts with that leaves it at least one token to feed (the
        step that samples its first output needs one), marked as used."""
        most = (len(prompt) - 1) // self.page_size
        if not self._entries or most < 1:
            return None
        for pages, h in reversed(list(enumerate(page_hashes(prompt, self.page_size, most), start=1))):
            entry = self._entries.get((pages, h))
            if entry is not None and list(entry.tokens) == list(prompt[: len(entry.tokens)]):
                self._used[(pages, h)] = next(self._clock)
                return entry
        return None

    def insert(self, entry: PrefixEntry) -> bool:
        """Index `entry`; False (and nothing changed) where its key is taken: the same prefix cached
        already, or, by a hash collision, another one."""
        pages, rest = divmod(len(entry.tokens), self.page_size)
        if rest or not pages or len(entry.pages) != pages:
            raise ValueError(f"an entry holds whole pages: {len(entry.tokens)} tokens in {len(entry.pages)} pages")
        key = self._key(entry.tokens, pages)
        if key in self._entries:
            return False
        self._entries[key] = entry
        self._used[key] = next(self._clock)
        return True

    def pop_least_recent(self) -> PrefixEntry | None:
        if not self._used:
            return None
        key = min(self._used, key=self._used.__getitem__)
        del self._used[key]
        return self._entries.pop(key)
