"""A step's dispatch bucket: the token rows per micro-batch that every rank's exchange carries.

With decode graphs, a decode step whose micro-batches fit the largest captured bucket is padded to
the smallest bucket that holds them (the colocated engine's decode_buckets rule, per micro-batch),
so every rank replays the graph of that one shape in lock step. Every other step (prefill, or a
decode too large for the graphs) runs eagerly at the next power of two.
"""
from __future__ import annotations

import bisect
import math

from minisgl.afd.args import AfdArgs
from minisgl.engine.graph import decode_buckets
from minisgl.engine.plan import EnginePlan


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def decode_graph_buckets(plan: EnginePlan, afd: AfdArgs) -> tuple[int, ...]:
    """The micro-batch sizes a worker prepares decode graphs for; () when decode steps are not
    planned in graph buckets (--afd-graph-buckets). A lane's micro-batch holds at most
    ceil(max_running_requests / num_mb) requests; --cuda-graph-max-bs caps it."""
    if not afd.graph_buckets:
        return ()
    largest = math.ceil(plan.pool.max_running_requests / afd.num_mb)
    if plan.args.cuda_graph_max_bs is not None:
        largest = min(largest, plan.args.cuda_graph_max_bs)
    return tuple(decode_buckets(largest))


def step_bucket(buckets: tuple[int, ...], mb_tokens: int, decode: bool) -> tuple[int, bool]:
    """(bucket, use_graph) for a step whose largest micro-batch has mb_tokens tokens."""
    if decode and buckets and mb_tokens <= buckets[-1]:
        return buckets[bisect.bisect_left(buckets, mb_tokens)], True
    return next_pow2(mb_tokens), False


def lane_prompt_tokens(plan: EnginePlan, max_prefill_tokens: int) -> int:
    """The most prompt tokens a lane's step holds: at most a chunk (of at most max_len - 1 tokens)
    for each of its slots, no more than its pages hold, and within --max-prefill-tokens."""
    pool, max_len = plan.pool, plan.max_seq_len
    return min(max_prefill_tokens, pool.max_running_requests * min(plan.args.chunked_prefill_size, max_len - 1),
               pool.usable_pages * pool.page_size)


def largest_bucket(plan: EnginePlan, max_prefill_tokens: int) -> int:
    """The largest bucket any step can use, what a transport's static buffers are sized for: a
    micro-batch holds at most its lane's step, a decode per slot beside the lane's prompt tokens,
    rounded up to a power of two (every graph bucket is at most a micro-batch's slots)."""
    return next_pow2(plan.pool.max_running_requests + lane_prompt_tokens(plan, max_prefill_tokens))


def check_graph_bucket(step: int, bucket: int, use_graph: bool, buckets: tuple[int, ...]) -> None:
    """A worker refuses a graph step of a shape it did not prepare: no rank may run a different shape."""
    if use_graph and bucket not in buckets:
        raise ValueError(f"step {step}: graph bucket {bucket} is not one this worker prepared {list(buckets)}")
