"""The AFD warm-up: the steps every worker runs in lock step after it is ready and before the
coordinator reports ready, and the summary of what they cost.

A lane's step shapes are the colocated engine's (engine/warmup.py): the prefill ladder up to the
largest step a lane can take, then decode steps, then (without decode graph buckets, where a step
may mix them) decodes beside prefill chunks. Each lane runs the same shape, split into micro-batches
as the coordinator splits real steps (afd/mb_split.py), and every worker gets the same bucket and
use_graph (afd/buckets.py). With graph buckets, each bucket gets one decode step at its shape, which
is where a worker will capture its graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from minisgl.afd.args import AfdArgs
from minisgl.afd.buckets import lane_prompt_tokens, step_bucket
from minisgl.afd.mb_split import split
from minisgl.afd.protocol import WarmupReply, WarmupStep
from minisgl.engine.plan import EnginePlan
from minisgl.engine.warmup import StepShape, decode_shapes, halves_shape, mixed_shapes, prefill_shapes, size_ladder
from minisgl.prefill_budget import lone_prompt_tokens


def wanted(mode: str, devices: list[str]) -> bool:
    """--afd-warmup: auto warms up where kernels compile and memory is measured, on GPUs."""
    return mode == "on" or (mode == "auto" and any(d.startswith("cuda") for d in devices))


def lane_shapes(plan: EnginePlan, graph_buckets: tuple[int, ...], num_mb: int,
                max_prefill_tokens: int) -> list[tuple[StepShape, bool]]:
    """(a lane's step, whether it is a decode step) for every shape class the coordinator can plan.
    Its prompt tokens stop at the most a lane's step holds (buckets.lane_prompt_tokens)."""
    chunk, max_len = plan.args.chunked_prefill_size, plan.max_seq_len
    rows = plan.pool.max_running_requests
    top = lane_prompt_tokens(plan, max_prefill_tokens)
    steps = [(s, False) for s in prefill_shapes(top, chunk, max_len)]
    # Split into micro-batches, prefill_shapes' step of halves may pair nothing: one pair in each.
    if (pair := halves_shape(top // num_mb, min(lone_prompt_tokens(chunk, top), max_len - 1))) is not None:
        steps.append((StepShape(pair.extend * num_mb, pair.prefix * num_mb), False))
    if graph_buckets:  # a graph's shape per bucket; decodes beyond the largest run eagerly
        sizes = [b * num_mb for b in graph_buckets]
        sizes += [n for n in size_ladder(rows) if math.ceil(n / num_mb) > graph_buckets[-1]]
        return steps + [(s, True) for s in decode_shapes(sizes, max_len)]
    steps += [(s, True) for s in decode_shapes(size_ladder(rows), max_len)]
    # Beside decodes a step may take the lane's whole prefill budget too (prefill_budget.py).
    return steps + [(s, False) for s in mixed_shapes(rows, chunk, max_len, top)]


def micro_batches(shape: StepShape, num_mb: int, how: str) -> tuple[StepShape, ...]:
    """The lane step split as the coordinator splits one (by count, or balancing context)."""
    items = list(zip(shape.extend, shape.prefix))
    groups = split(items, [e + p for e, p in items], num_mb, how)
    return tuple(StepShape(tuple(e for e, _ in g), tuple(p for _, p in g)) for g in groups)


def warmup_steps(plan: EnginePlan, afd: AfdArgs, graph_buckets: tuple[int, ...],
                 max_prefill_tokens: int) -> list[WarmupStep]:
    shapes = lane_shapes(plan, graph_buckets, afd.num_mb, max_prefill_tokens)
    steps = []
    for i, (shape, decode) in enumerate(shapes):
        mbs = micro_batches(shape, afd.num_mb, afd.mb_split)
        bucket, use_graph = step_bucket(graph_buckets, max(mb.num_tokens for mb in mbs), decode)
        steps.append(WarmupStep(i, bucket, use_graph, "decode" if decode else "prefill", mbs, last=i == len(shapes) - 1))
    return steps


@dataclass(frozen=True)
class WarmupReport:
    """Every worker's reply to every warm-up step, in step order."""

    steps: int
    seconds: float
    replies: tuple[dict[str, WarmupReply], ...]

    def compiles(self) -> dict[str, int]:
        """Each worker's Triton compiles and autotuning runs over the whole warm-up."""
        workers = sorted(self.replies[0]) if self.replies else []
        return {w: sum(r[w].compiles for r in self.replies) for w in workers}

    def peak_bytes(self) -> dict[str, int | None]:
        """Each worker's largest step peak beyond what it held before the step (None off CUDA)."""
        workers = sorted(self.replies[0]) if self.replies else []
        return {w: None if any(r[w].peak_bytes is None for r in self.replies)
                else max(r[w].peak_bytes for r in self.replies) for w in workers}

    def graphs(self) -> dict[str, int]:
        """The decode-step CUDA graphs each worker holds after the warm-up (0 where they run eagerly)."""
        return {w: r.graphs for w, r in self.replies[-1].items()} if self.replies else {}

    def describe(self) -> str:
        peaks = self.peak_bytes()
        peak = ("not measured off CUDA" if any(p is None for p in peaks.values()) else
                ", ".join(f"{w} {p / 2**30:.2f} GiB" for w, p in peaks.items()))
        compiles = self.compiles()
        return (f"AFD warm-up: {self.steps} lock-step steps in {self.seconds:.1f} s; Triton compiles/autotunes "
                f"{sum(compiles.values())} (" + ", ".join(f"{w} {n}" for w, n in compiles.items())
                + f"); largest step beyond the pool: {peak}; decode graphs held: "
                + (", ".join(f"{w} {n}" for w, n in sorted(self.graphs().items())) or "none"))
