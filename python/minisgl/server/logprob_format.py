"""TokenLogprobs -> the three JSON shapes clients expect: the legacy completions block, the chat
`content` list, and vLLM's `prompt_logprobs` list (what alignment tools read)."""
from __future__ import annotations

from typing import Any, Sequence

from minisgl.scheduler.messages import TokenLogprob
from minisgl.tokenizer.token_text import TokenTexts

Entry = tuple[int, TokenLogprob | None]  # (token id, its logprob entry; None for the first prompt token)


class LogprobFormatter:
    def __init__(self, texts: TokenTexts) -> None:
        self.texts = texts

    def _text(self, token_id: int) -> str:
        return self.texts.get(token_id)[0]

    def completion(self, entries: Sequence[Entry], offset: int) -> dict[str, Any]:
        """{tokens, token_logprobs, top_logprobs, text_offset}, offsets counted from `offset`."""
        tokens, lps, tops, offsets = [], [], [], []
        for token_id, e in entries:
            text = self._text(token_id)
            tokens.append(text)
            lps.append(None if e is None else e.logprob)
            tops.append(None if e is None else {self._text(t): lp for t, lp in e.top})
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def _chat_token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = self.texts.get(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    def chat(self, entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        return [
            {**self._chat_token(e.token_id, e.logprob), "top_logprobs": [self._chat_token(t, lp) for t, lp in e.top]}
            for e in entries
        ]

    def prompt(self, entries: Sequence[TokenLogprob | None]) -> list[dict[str, Any] | None]:
        """vLLM's shape: per position None or {token id: {logprob, rank, decoded_token}}, holding the
        prompt token itself and the top alternatives."""
        out: list[dict[str, Any] | None] = []
        for e in entries:
            if e is None:
                out.append(None)
                continue
            d = {str(tid): {"logprob": lp, "rank": r + 1, "decoded_token": self._text(tid)}
                 for r, (tid, lp) in enumerate(e.top)}
            d[str(e.token_id)] = {"logprob": e.logprob, "rank": e.rank, "decoded_token": self._text(e.token_id)}
            out.append(d)
        return out
