"""The OpenAI /v1/completions wire format as alignment uses it, with vLLM's extensions (which
minisgl and SGLang follow): request bodies, and the token ids and prompt logprobs in the replies.

Prompts always travel as token ids, so no server re-tokenizes them. Completion token ids come back
in vLLM's `token_ids` (`return_token_ids`, vLLM >= 0.10.2, minisgl); text is never re-tokenized,
because that is lossy. A server without them can still be sampled (text and token counts), but
not scored.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minisgl.tools.align.metrics import TokenScore

# Alternatives per scored position: the reference's top-1 is all the metrics need, and every
# extra alternative multiplies the reply size by the sequence length.
SCORE_TOP_LOGPROBS = 1


class WireError(ValueError):
    """A reply that alignment cannot use, with what the server must support instead."""


def sample_body(model: str, prompt_ids: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
    """Greedy, EOS ignored, so every completion has max_new_tokens tokens."""
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max_new_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }


def score_body(model: str, seq_ids: Sequence[int]) -> dict[str, Any]:
    """Teacher forcing: score every token of seq without generating (OpenAI's echo with
    max_tokens 0; vLLM's prompt_logprobs gives each token's logprob and rank)."""
    return {
        "model": model,
        "prompt": list(seq_ids),
        "max_tokens": 0,
        "echo": True,
        "temperature": 0.0,
        "prompt_logprobs": SCORE_TOP_LOGPROBS,
        "return_token_ids": True,
    }


def only_choice(reply: dict[str, Any]) -> dict[str, Any]:
    choices = reply.get("choices") or []
    if len(choices) != 1:
        raise WireError(f"expected one choice, got {len(choices)}: {str(reply)[:300]}")
    return choices[0]


NO_TOKEN_IDS = (
    "the candidate server returned no completion token ids, so its samples cannot be scored: it must "
    "support vLLM's `return_token_ids` (choices[].token_ids)"
)


def completion_ids(choice: dict[str, Any]) -> list[int] | None:
    """The completion's token ids, or None when the server does not say them."""
    ids = choice.get("token_ids")
    return None if ids is None else [int(t) for t in ids]


def completion_tokens(reply: dict[str, Any]) -> int:
    return int((reply.get("usage") or {}).get("completion_tokens", 0))


def _entry_rank1(entry: dict[str, Any]) -> int | None:
    return next((int(t) for t, e in entry.items() if e.get("rank") == 1), None)


def prompt_scores(choice: dict[str, Any], seq_ids: Sequence[int], start: int) -> list[TokenScore]:
    """The reference's view of seq_ids[start:], from vLLM's prompt_logprobs: per position None
    (the first) or {token id: {logprob, rank, decoded_token}} holding the token there and the
    top alternatives. Checks that the reference saw exactly our ids."""
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != list(seq_ids):
        diff = next((i for i, (a, b) in enumerate(zip(echoed, seq_ids)) if a != b), min(len(echoed), len(seq_ids)))
        raise WireError(f"the reference echoed different token ids (first difference at position {diff} of "
                        f"{len(seq_ids)}; it got {len(echoed)} ids)")
    plp = choice.get("prompt_logprobs")
    if plp is None:
        raise WireError("the reference server returned no prompt_logprobs: it must implement vLLM's "
                        "`prompt_logprobs` extension of /v1/completions")
    if len(plp) != len(seq_ids):
        raise WireError(f"prompt_logprobs has {len(plp)} positions for {len(seq_ids)} tokens")
    out = []
    for pos in range(1, len(seq_ids)):
        entry = plp[pos] or {}
        mine = entry.get(str(seq_ids[pos]))
        if mine is None:  # without prompt_token_ids, this is the echo check
            raise WireError(f"position {pos}: the reference scored other tokens ({sorted(entry)[:5]}) than "
                            f"ours ({seq_ids[pos]})")
        if pos < start:
            continue
        top1 = _entry_rank1(entry)
        if top1 is None:
            raise WireError(f"position {pos}: no rank-1 entry; ask for prompt_logprobs >= 1")
        out.append(TokenScore(seq_ids[pos], float(mine["logprob"]), int(mine["rank"]), top1))
    return out
