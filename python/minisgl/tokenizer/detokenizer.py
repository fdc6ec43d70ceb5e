"""Incremental, UTF-8-safe detokenization.

Decoding each token alone is wrong for byte-level BPE (one CJK character spans several tokens)
and for tokenizers whose spacing depends on the neighbour; decoding everything each time is
O(n^2). So each push decodes a short window: the tokens already emitted since the last boundary
(as context) plus the new ones, and emits only the text past the context's. A window that ends
in U+FFFD ends mid-character, so nothing is emitted until the character completes (or flush()).
"""
from __future__ import annotations

from typing import Sequence

from transformers import PreTrainedTokenizerBase

from minisgl.scheduler.stop import first_stop

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []  # only the window: everything before it has been emitted
        self._read = 0  # _ids[:_read] are emitted context; _ids[_read:] are not emitted yet

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the text they complete (possibly "")."""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back, replacement characters and all: the sequence has ended."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._ids[: self._read])
        after = self._decode(self._ids)
        if not final and (len(after) <= len(before) or after.endswith(_INCOMPLETE)):
            return ""
        # The emitted text ends on a character boundary, so the next window can start here.
        self._ids = self._ids[self._read :]
        self._read = len(self._ids)
        return after[len(before) :]


class TextStream:
    """One request's output text as a stream of deltas.

    While the request runs, the last (longest stop - 1) characters are held back: they may turn
    out to begin a stop string, which must never reach the client. The scheduler finishes a
    request as soon as a stop string completes past its first min_tokens tokens, so the text is
    cut at the first stop string that ends after those tokens' text (dropped, as OpenAI does)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool, stops: Sequence[str], min_tokens: int = 0
    ) -> None:
        self.decoder = IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self.stops = tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.unchecked_tokens = min_tokens  # tokens whose text no stop string may end in
        self.checked_from = 0  # len(text) once those tokens were pushed

    def push(self, token_ids: Sequence[int], finished: bool) -> str:
        if self.unchecked_tokens:
            head, token_ids = token_ids[: self.unchecked_tokens], token_ids[self.unchecked_tokens :]
            self.text += self.decoder.push(head)
            self.unchecked_tokens -= len(head)
            self.checked_from = len(self.text)
        self.text += self.decoder.push(token_ids)
        if finished:
            self.text += self.decoder.flush()
            hit = first_stop(self.text, self.stops, self.checked_from) if self.stops else None
            if hit is not None:
                self.text = self.text[: hit[0]]
            end = len(self.text)
        else:
            end = max(self.sent, len(self.text) - self.hold)
        delta, self.sent = self.text[self.sent : end], end
        return delta
