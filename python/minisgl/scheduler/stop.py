"""Stop-string detection as a request's text grows, one token at a time.

The scheduler sits below the tokenizer room, so it takes the incremental decoder as a protocol.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence


class IncrementalDecoder(Protocol):
    def push(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the newly complete text (never half a UTF-8 character)."""


DecoderFactory = Callable[[bool], IncrementalDecoder]  # skip_special_tokens -> a fresh decoder


def first_stop(text: str, stops: Sequence[str], new_from: int) -> tuple[int, str] | None:
    """The earliest (index, stop) among occurrences that end past text[new_from:]'s start, i.e.
    that were not complete in text[:new_from]; None if there is none."""
    hits = [(i, s) for s in stops if (i := text.find(s, max(0, new_from - len(s) + 1))) >= 0]
    return min(hits) if hits else None


class StopChecker:
    """Keeps only the last (longest stop - 1) characters, so each token costs O(stop length)."""

    def __init__(self, stops: Sequence[str], decoder: IncrementalDecoder) -> None:
        self.stops = tuple(stops)
        self.keep = max(len(s) for s in self.stops) - 1
        self.decoder = decoder
        self.tail = ""

    def push(self, token_id: int, detect: bool = True) -> str | None:
        """The stop string that the new text completes first, if any (always None without detect)."""
        delta = self.decoder.push([token_id])
        if not delta:
            return None
        window = self.tail + delta
        hit = first_stop(window, self.stops, len(self.tail)) if detect else None
        self.tail = window[-self.keep :] if self.keep else ""
        return hit[1] if hit else None
