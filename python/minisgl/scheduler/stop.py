"""Stop-string detection as a request's text grows, one token at a time.

The scheduler sits below the tokenizer room, so it takes the incremental decoder as a protocol.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence


class IncrementalDecoder(Protocol):
    def push(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the newly complete text (never half a UTF-8 character)."""


DecoderFactory = Callable[[bool], IncrementalDecoder]  # skip_special_tokens -> a fresh decoder


class StopChecker:
    """Keeps only the last (longest stop - 1) characters, so each token costs O(stop length)."""

    def __init__(self, stops: Sequence[str], decoder: IncrementalDecoder) -> None:
        self.stops = tuple(stops)
        self.keep = max(len(s) for s in self.stops) - 1
        self.decoder = decoder
        self.tail = ""

    def push(self, token_id: int) -> str | None:
        """The stop string that now appears first in the text, if any."""
        delta = self.decoder.push([token_id])
        if not delta:
            return None
        window = self.tail + delta
        hits = [(i, s) for s in self.stops if (i := window.find(s)) >= 0]
        self.tail = window[-self.keep :] if self.keep else ""
        return min(hits)[1] if hits else None
