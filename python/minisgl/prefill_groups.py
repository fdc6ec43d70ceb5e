"""Which requests of a prefill step go through the GDN chunked delta rule together.

The rule's intermediates (per 64-token chunk and value head a K x V state, plus w, u, A and the
output: ~0.1 MiB a token at 122B shapes, 1.8 GiB at 16K tokens) were the largest prefill step's
activation peak, and the memory planner keeps every byte of that peak from the pool. Above
GROUP_TOKENS, consecutive requests go through the rule in at most MAX_GROUPS groups: each
request's arithmetic is unchanged, and the peak follows the group, not the step. MAX_GROUPS is
fla's identity cache of varlen metadata (FLA_TENSOR_CACHE_SIZE, 4 by default): with more groups
than it holds, every layer would rebuild each group's chunk indices, each a host sync.
"""
from __future__ import annotations

from typing import Sequence

GROUP_TOKENS = 4096
MAX_GROUPS = 4


def prefill_groups(extend_lens: Sequence[int], min_tokens: int = GROUP_TOKENS,
                   max_groups: int = MAX_GROUPS) -> list[tuple[int, int]]:
    """Consecutive request ranges [i, j) covering every request: a group closes once it holds at
    least max(min_tokens, total / max_groups) tokens, so there are at most max_groups of them."""
    if min_tokens < 1 or max_groups < 1:
        raise ValueError(f"min_tokens and max_groups must be >= 1, got {min_tokens}, {max_groups}")
    target = max(min_tokens, -(-sum(extend_lens) // max_groups))
    groups: list[tuple[int, int]] = []
    start, tokens = 0, 0
    for i, n in enumerate(extend_lens):
        tokens += n
        if tokens >= target:
            groups.append((start, i + 1))
            start, tokens = i + 1, 0
    if start < len(extend_lens):
        groups.append((start, len(extend_lens)))
    return groups
