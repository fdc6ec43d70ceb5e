"""How many prompt tokens one step may take.

Without decoding requests a step takes up to --max-prefill-tokens. While requests decode, each
of them waits for the step's prefill, so the step's prompt tokens grow with the decode batch:
--prefill-tokens-per-decode for each decoding request, at least one chunk (--chunked-prefill-size)
and at most --max-prefill-tokens. A fixed chunk beside a large batch admitted one prompt a step:
with 512 slots and a burst of 1K prompts, most slots waited seconds for their prefill while the
GPU decoded a few rows (docs/benchmarks.md). At small batches the rule keeps the one chunk that
bounds the inter-token latency.
"""
from __future__ import annotations


def step_prefill_budget(decodes: int, chunk: int, per_decode: int, max_prefill_tokens: int) -> int:
    """The prompt tokens a step may take beside `decodes` decoding requests."""
    if decodes == 0:
        return max_prefill_tokens
    return min(max_prefill_tokens, max(chunk, per_decode * decodes))
