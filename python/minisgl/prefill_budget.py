"""How many prompt tokens one step may take.

Without decoding requests a step takes up to --max-prefill-tokens. While requests decode, each of
them waits for the step's prefill, so the budget weighs the requests still to prefill against
those decoding. It is the largest of:
- one chunk (--chunked-prefill-size): with a few dozen requests and prompts arriving one by one,
  every decode waits behind at most one chunk, which bounds the inter-token latency;
- --prefill-tokens-per-request for each request running or waiting: a crowd of 512 slots fills
  at 8,192 tokens a step, not one 1K prompt a step (docs/benchmarks.md: 1.5x the 35B's throughput
  profile, and the TTFT median of 200 prompts arriving together from 8.6 to 3.1 s);
- while prompts still to prefill outnumber 1.5x the decoding requests, the queue is what most
  requests wait on: the budget climbs from one chunk towards --max-prefill-tokens with the share of
  the prompts beyond 1.5x the decodes. When 57 long prompts waited beside 4 decodes, one chunk a
  step left the GPU prefilling at a fifth of its speed for minutes; when 76 of vLLM's Long Context
  prompts (32K tokens) waited beside 24 decodes, a chunk for each prompt per decode (3K-token
  steps) served 40.9K tok/s where one 16K-token step alone runs at 45K. The threshold 1.5 was
  chosen with benchmarks/sim_prefill_budget.py, whose step-cost model reproduces the served Long
  Context rows within 1% (docs/benchmarks.md): from 1x the decodes, 8K prompts arriving in waves
  of 64 took 16K-token steps beside the first decodes and doubled their ITL P99; from 1.5x, ITL
  P99 is below the former rule's and Long Context keeps most of the gain. With at most 1.5x as
  many prompts as decodes (a steady stream of arrivals), one chunk: inter-token latency stays
  bounded.
At most --max-prefill-tokens.

In a step without decodes, budget that no other prompt can take (nothing waits that fits, or
nothing waits at all) goes to the prompts already in the step, oldest first, each up to
lone_prompt_tokens: a long prompt alone on an idle server then prefills in steps of thousands of
tokens, as SGLang's and vLLM's do under their step budgets, not a chunk a step (each chunk-sized
step reads every expert's weights for a thousand tokens). Beside decodes chunks do not grow: taking
the whole of a ramped budget there raised the 122B's ITL P99 at 8K/256 c=32 from 75.6 to 86.5 ms
(docs/benchmarks.md), so decoding requests wait behind no more prompt tokens than before.
"""
from __future__ import annotations

from minisgl.prefill_groups import GROUP_TOKENS


def step_prefill_budget(
    decodes: int, prefilling: int, requests: int, chunk: int, per_request: int, max_prefill_tokens: int
) -> int:
    """The prompt tokens a step may take beside `decodes` decoding requests, while `prefilling` of
    the `requests` running or waiting still have prompt tokens to feed."""
    if decodes == 0:
        return max_prefill_tokens
    return min(max_prefill_tokens, max(chunk, per_request * requests, _queue_share(decodes, prefilling, chunk,
                                                                                   max_prefill_tokens)))


def _queue_share(decodes: int, prefilling: int, chunk: int, max_prefill_tokens: int) -> int:
    """One chunk, plus the rest of the step budget in the share of the prompts beyond 1.5x the decodes."""
    surplus = 2 * prefilling - 3 * decodes  # in halves of a request
    if surplus <= 0:
        return chunk
    return chunk + max(0, max_prefill_tokens - chunk) * surplus // (2 * prefilling)


def lone_prompt_tokens(chunk: int, max_prefill_tokens: int) -> int:
    """The most prompt tokens one request may take in a step from budget no other prompt can take:
    a default GDN group (prefill_groups.GROUP_TOKENS), so its call of the chunked rule holds no
    more than a group the memory planner measured, and the warm-up ran such steps (engine/warmup.py);
    never less than a chunk."""
    return max(chunk, min(max_prefill_tokens, GROUP_TOKENS))
