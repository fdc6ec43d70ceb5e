"""Which cached token sequence a new prompt starts with: entries found by a chain of page hashes,
verified token by token, least recently used first out.

A hybrid model's recurrent state is kept only where the allocator asks for it (a snapshot as a
prefill passes that point, or where a request stopped), so a sequence is cached at one length (its
entry), not at every page as an attention-only radix tree would: a prompt reuses
the longest entry it starts with. Two kinds:
- a prefix: whole pages, shared by every prompt that starts with it (each gets a copy of its state);
- a parked sequence: all a finished request fed (its last page may be partial), taken over whole
  by the one prompt that continues it (the next call of an agent), which writes on into that page.

It also remembers the page prefixes of recent prompts, as a tree of page hashes: where recent
prompts branch (a page prefix two of them continue differently, or both end at) is where to cache,
since every prompt through it will reuse it: a system prompt many users' prompts begin with. A
conversation's next turn continues its last one, which ends where it branches off: no branch (the
next turn takes the finished one over instead, parked). A prompt that shares nothing is not worth a
step to cache a prefix of. And it remembers the prefixes running requests are about to cache
(prompts that start with one wait for it).
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, Sequence


# Page prefixes of recent prompts remembered (note), oldest out first: ~340 bytes of host memory
# each (measured), so ~44 MiB; at 64-token pages 1,000 prompts of 8K tokens, 8,000 of 1K.
RECENT_PAGES = 1 << 17


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


def _parts(node: list, after: tuple[int, ...], last: bool) -> bool:
    """Whether another recent prompt through this page prefix goes on differently from a noted
    prompt that has `after` after it (`last`: the prompt ends in the next page), or is the same."""
    nexts, ends = node
    if not last and nexts > 1:  # another next page than the prompt's own
        return True
    for rest, n in ends.items():  # prompts that end within the next page
        if rest == after:
            if n > 1:  # the prompt itself, and the same prompt again
                return True
        elif after[: len(rest)] != rest:  # not one the prompt continues (its conversation's last turn)
            return True
    return False


class PrefixIndex:
    """Entries by (their whole pages, the chained hash of those pages)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._buckets: dict[tuple[int, int], list[PrefixEntry]] = {}
        self._used: dict[PrefixEntry, int] = {}  # entry -> clock of its insert or last hit
        self._proven: set[PrefixEntry] = set()  # prefixes cached where prompts branch, or reused twice (insert)
        self._taken_once: set[PrefixEntry] = set()  # unproven prefixes one prompt has reused
        self._clock = itertools.count()
        self._expected: dict[tuple[int, int], int] = {}  # key -> running requests about to cache it
        # key -> [distinct next pages, {what prompts that end within the next page have there: how many}]
        self._seen: OrderedDict[tuple[int, int], list] = OrderedDict()

    def __len__(self) -> int:
        return len(self._used)

    def entries(self) -> list[PrefixEntry]:
        return list(self._used)

    def key(self, tokens: Sequence[int]) -> tuple[int, int]:
        """(whole pages of `tokens`, their chained hash): what entries, expectations and the noted
        prompts' prefixes are found by."""
        pages = len(tokens) // self.page_size
        *_, h = page_hashes(tokens, self.page_size, pages)
        return pages, h

    def prompt_keys(self, prompt: Sequence[int]) -> list[tuple[int, int]]:
        """The keys of `prompt`'s page prefixes that leave it a token, the empty one first: where
        match() looks (a waiting request keeps them for longest())."""
        return list(enumerate(page_hashes(prompt, self.page_size, (len(prompt) - 1) // self.page_size)))

    def _find(self, prompt: Sequence[int], keys: list[tuple[int, int]]) -> PrefixEntry | None:
        if not self._used:
            return None
        for key in reversed(keys):
            for entry in self._buckets.get(key, ()):  # longest first
                n = len(entry.tokens)
                if n < len(prompt) and list(entry.tokens) == list(prompt[:n]):
                    return entry
        return None

    def match(self, prompt: Sequence[int]) -> PrefixEntry | None:
        """The longest entry `prompt` starts with that leaves it at least one token to feed (the
        step that samples its first output needs one), marked as used."""
        entry = self._find(prompt, self.prompt_keys(prompt)) if self._used else None
        if entry is not None:
            self._used[entry] = next(self._clock)
            if entry in self._taken_once:
                self._taken_once.remove(entry)
                self._proven.add(entry)
            elif entry not in self._proven and not entry.parked:
                self._taken_once.add(entry)
        return entry

    def taken_once(self, entry: PrefixEntry) -> bool:
        """Whether `entry` is an unproven prefix (a chat turn's tail) that one prompt has reused: most
        likely its conversation's next turn, which goes on to cache a tail of its own."""
        return entry in self._taken_once

    def longest(self, prompt: Sequence[int], keys: list[tuple[int, int]]) -> int:
        """How many tokens of `prompt` match() would reuse now (nothing marked); `keys`: prompt_keys(prompt)."""
        entry = self._find(prompt, keys)
        return len(entry.tokens) if entry is not None else 0

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether an entry holds exactly `tokens`."""
        return any(e.tokens == tuple(tokens) for e in self._buckets.get(self.key(tokens), ()))

    def insert(self, entry: PrefixEntry, proven: bool = False) -> bool:
        """Index `entry`; False (and nothing changed) where the same tokens are cached already. A
        prefix where recent prompts branch is `proven` from the start; one cached for a next turn
        that may not come (a chat turn's tail), once a second prompt reuses it: the first is most
        likely the next turn, which caches a tail of its own and leaves this one behind."""
        pages, rest = divmod(len(entry.tokens), self.page_size)
        if not entry.tokens or (rest and not entry.parked):
            raise ValueError(f"a shared prefix holds whole pages, not {len(entry.tokens)} tokens")
        if len(entry.pages) != pages + bool(rest):
            raise ValueError(f"{len(entry.tokens)} tokens in {len(entry.pages)} pages of {self.page_size}")
        if self.holds(entry.tokens):
            return False
        bucket = self._buckets.setdefault(self.key(entry.tokens), [])
        bucket.append(entry)
        bucket.sort(key=lambda e: -len(e.tokens))
        self._used[entry] = next(self._clock)
        if proven and not entry.parked:
            self._proven.add(entry)
        return True

    def note(self, prompt: Sequence[int]) -> None:
        """Remember that `prompt` arrived: each of its page prefixes (those that leave it a token),
        among the last RECENT_PAGES noted."""
        most = (len(prompt) - 1) // self.page_size
        node = None
        for key in itertools.islice(enumerate(page_hashes(prompt, self.page_size, most)), 1, None):
            if key not in self._seen:
                self._seen[key] = [0, {}]
                if node is not None:
                    node[0] += 1
            node = self._seen[key]
            self._seen.move_to_end(key)
        if node is not None:
            rest = tuple(prompt[most * self.page_size :])
            node[1][rest] = node[1].get(rest, 0) + 1
        while len(self._seen) > RECENT_PAGES:
            self._seen.popitem(last=False)

    def shared_pages(self, prompt: Sequence[int]) -> int:
        """The most whole pages `prompt` (noted) shares with another recent prompt that goes on
        differently after them (or is the same prompt): where a system prompt many users' prompts
        begin with ends. 0 for a prompt that shares nothing with them (a random benchmark's) or
        only continues one (the next turn of a conversation, whose last turn it takes over): a
        slot holding what no other prompt reuses would be lost. (A chat turn parts from its last
        turn a few tokens before that one's end, where the template renders it anew; the allocator
        caches nothing there for a turn that reused that one's tail.)"""
        most = (len(prompt) - 1) // self.page_size
        for pages, h in reversed(list(enumerate(page_hashes(prompt, self.page_size, most)))[1:]):
            node = self._seen.get((pages, h))
            if node is not None and _parts(node, tuple(prompt[pages * self.page_size :]), pages == most):
                return pages
        return 0

    def expect(self, tokens: Sequence[int]) -> tuple[int, int]:
        """A running request will cache `tokens` (a shared prefix) once its prefill gets there; the
        key to settle() when it has or never will."""
        key = self.key(tokens)
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
        key = self.key(entry.tokens)
        self._buckets[key].remove(entry)
        if not self._buckets[key]:
            del self._buckets[key]
        del self._used[entry]
        self._proven.discard(entry)
        self._taken_once.discard(entry)

    def evictable(self, proven: bool) -> bool:
        """Whether pop_least_recent(proven) would find an entry."""
        return len(self._used) > (0 if proven else len(self._proven))

    def pop_least_recent(self, proven: bool = True) -> PrefixEntry | None:
        """The entry to evict, least recently used first within the first of these kinds that has one:
        parked sequences; unproven prefixes one prompt has reused (a chat tail its next turn has
        left behind); unproven ones no prompt has (a tail waiting for its next turn); where `proven`
        allows, those prompts share. A parked sequence serves one continuation and an unproven
        prefix perhaps one, a proven one every prompt that starts with it (as a radix tree evicts
        its leaves before the prefixes they extend); a tail evicts no proven prefix."""
        pool = ([e for e in self._used if e.parked] or list(self._taken_once)
                or [e for e in self._used if e not in self._proven] or (list(self._used) if proven else []))
        if not pool:
            return None
        entry = min(pool, key=self._used.__getitem__)
        self.remove(entry)
        return entry
