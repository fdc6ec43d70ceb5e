"""Which requests of a prefill step go through the GDN chunked delta rule together.

The rule's intermediates grow with the tokens (per 64-token chunk and value head a K x V state,
plus w, u, A and the output: ~0.1 MiB a token at 122B shapes, 1.8 GiB at 16K tokens) and with the
requests (each one's state gathered in, and its final state out: 12 MiB a request at 122B shapes).
The memory planner reserves the largest step's measured peak, so an unbounded call would make
every pool smaller, or a step of many short prompts run out of memory. Consecutive requests go
through the rule in groups of at most GROUP_TOKENS tokens (a longer request alone) and at most
GROUP_REQUESTS requests; each request's arithmetic is unchanged. The warm-up measures a step of
full groups of both kinds (engine/warmup.py). On a GPU an engine may take groups of its whole step
budget instead, where that grows the largest steps' measured peak by a small share of its memory
(engine/device_memory.py): one group then gives fla's recurrence several sequences at once. Its
batches carry that bound (ForwardBatch.gdn_group_tokens); GROUP_TOKENS stays the default.
"""
from __future__ import annotations

from typing import Sequence

GROUP_TOKENS = 4096
GROUP_REQUESTS = 16


def prefill_groups(extend_lens: Sequence[int], max_tokens: int | None = None,
                   max_requests: int | None = None) -> list[tuple[int, int]]:
    """Consecutive request ranges [i, j) covering every request, each of at most max_requests
    requests and at most max_tokens tokens unless it is one request (by default the module's
    bounds, read at each call so that benchmarks/bench_prefill.py can try others)."""
    max_tokens = GROUP_TOKENS if max_tokens is None else max_tokens
    max_requests = GROUP_REQUESTS if max_requests is None else max_requests
    if max_tokens < 1 or max_requests < 1:
        raise ValueError(f"max_tokens and max_requests must be >= 1, got {max_tokens}, {max_requests}")
    groups: list[tuple[int, int]] = []
    start, tokens = 0, 0
    for i, n in enumerate(extend_lens):
        if i > start and (tokens + n > max_tokens or i - start == max_requests):
            groups.append((start, i))
            start, tokens = i, 0
        tokens += n
    if extend_lens:
        groups.append((start, len(extend_lens)))
    return groups
