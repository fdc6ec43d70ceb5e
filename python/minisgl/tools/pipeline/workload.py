"""A decode step's workload (requests' contexts, micro-batches, M:N) plus a cost model -> the
simulator's StepSpec. Requests are split into micro-batches exactly as the coordinator splits them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from minisgl.afd.mb_split import MB_SPLITS, split
from minisgl.models.config import FULL_ATTENTION, LINEAR_ATTENTION
from minisgl.tools.pipeline.sim import FULL, GDN, KINDS, LaneCosts, StepSpec

_KIND_OF = {LINEAR_ATTENTION: GDN, FULL_ATTENTION: FULL}


def kinds_of(layer_types: Sequence[str]) -> tuple[str, ...]:
    return tuple(_KIND_OF[t] for t in layer_types)


class Costs(Protocol):
    """µs of one micro-batch's items (roofline, or a measured per-layer table)."""

    def attn(self, kind: str, batch: int, context: int) -> float: ...

    def shared(self, batch: int) -> float: ...

    def expert(self, tokens: int, expert_workers: int) -> float: ...

    def head(self, batch: int) -> float: ...

    def tail(self, batch: int) -> float: ...

    def transfers(self, batch: int, attn_workers: int, expert_workers: int) -> tuple[float, float]: ...


@dataclass(frozen=True)
class Workload:
    contexts: tuple[int, ...]  # one lane's decode requests in running order (oldest first); lanes alike
    num_mb: int
    attn_workers: int
    expert_workers: int
    mb_split: str = "count"

    def __post_init__(self) -> None:
        if self.num_mb < 1 or self.attn_workers < 1 or self.expert_workers < 1:
            raise ValueError("num_mb, attn_workers and expert_workers must be >= 1")
        if len(self.contexts) < self.num_mb:
            raise ValueError(f"{len(self.contexts)} requests per lane cannot fill {self.num_mb} micro-batches")
        if min(self.contexts) < 1:
            raise ValueError("every context must be >= 1 token")
        if self.mb_split not in MB_SPLITS:
            raise ValueError(f"mb_split must be one of {MB_SPLITS}, got {self.mb_split!r}")

    def micro_batches(self) -> list[list[int]]:
        """Each micro-batch's contexts."""
        return split(list(self.contexts), self.contexts, self.num_mb, self.mb_split)


def spread_contexts(batch: int, context: int, context_max: int | None) -> tuple[int, ...]:
    """`batch` contexts from context_max (the oldest request) down to context, evenly; all equal without a max."""
    top = context if context_max is None else context_max
    if batch == 1:
        return (top,)
    return tuple(round(top + (context - top) * i / (batch - 1)) for i in range(batch))


def build_spec(kinds: tuple[str, ...], work: Workload, costs: Costs) -> StepSpec:
    mbs = work.micro_batches()
    sizes = [len(mb) for mb in mbs]
    attn = {k: tuple(costs.attn(k, len(mb), sum(mb)) for mb in mbs) for k in KINDS}
    shared = {k: tuple(costs.shared(b) for b in sizes) for k in KINDS}
    lane = LaneCosts(attn, shared, sum(costs.head(b) for b in sizes), tuple(costs.tail(b) for b in sizes))
    expert = tuple(costs.expert(work.attn_workers * b, work.expert_workers) for b in sizes)
    bucket = 1 << (max(sizes) - 1).bit_length()  # messages are padded to the step's bucket
    dispatch, combine = costs.transfers(bucket, work.attn_workers, work.expert_workers)
    return StepSpec(kinds, work.num_mb, (lane,) * work.attn_workers, {k: expert for k in KINDS}, dispatch, combine)
