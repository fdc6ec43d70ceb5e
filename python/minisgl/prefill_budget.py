"""How many prompt tokens one step may take.

Without decoding requests a step takes up to --max-prefill-tokens. While requests decode, each of
them waits for the step's prefill, so the step takes --prefill-tokens-per-request for each request
in the server (running or waiting), at least one chunk (--chunked-prefill-size) and at most
--max-prefill-tokens. A fixed chunk admitted one 1K prompt a step however many waited: a burst of
200 prompts beside a few decodes took seconds to reach the GPU, and 512 slots filled at a few
hundred tokens a step (docs/benchmarks.md). With a few dozen requests the rule keeps the one chunk
that bounds the inter-token latency.
"""
from __future__ import annotations


def step_prefill_budget(decodes: int, requests: int, chunk: int, per_request: int, max_prefill_tokens: int) -> int:
    """The prompt tokens a step may take beside `decodes` decoding requests, with `requests`
    requests running or waiting."""
    if decodes == 0:
        return max_prefill_tokens
    return min(max_prefill_tokens, max(chunk, per_request * requests))
