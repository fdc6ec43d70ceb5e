"""Token id -> (text, bytes), for logprobs.

A byte-level BPE token can hold part of a UTF-8 character; its text is then written as
"bytes:\\xe4\\xb8", as OpenAI does, and `bytes` carries the raw bytes so clients can rejoin them.
"""
from __future__ import annotations

from functools import lru_cache

from transformers import PreTrainedTokenizerBase


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet: printable Latin-1 bytes stand for themselves, the
    other 68 bytes are shifted to code points 256 and up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    shifted = sorted(set(range(256)) - set(printable))
    table.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return table


class TokenTexts:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, tuple[int, ...]]] = {}

    def bytes_of(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        table = _unicode_to_byte()
        if piece is not None and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return self.tokenizer.decode([token_id]).encode()  # not byte-level (or a special token)

    def get(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self.bytes_of(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            hit = self._cache[token_id] = (text, tuple(raw))
        return hit
