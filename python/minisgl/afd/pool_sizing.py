"""Sizing the AFD attention workers' pools on GPUs (without --num-pages): the colocated planner's
rules (kvcache/planner.py) applied to what each worker measured.

Before it says ready, every worker runs the probe steps below in lock step (an attention worker on
a scratch pool of one slot), measuring its largest step; once every worker has done so and let go
of its cache, each reads what its device has free and all share their figures (afd/pool_probe.py).
Then each lane plans, from these figures alone:

- a device's budget is what is free there with every worker on it loaded, less the largest step of
  each worker on it (an expert worker's included: it holds no pool, but its activations need room),
  times --mem-fraction-static; attention workers sharing the device split it evenly;
- a lane's TP ranks plan from the tightest rank: the smallest share, the costliest slot, page and
  decode row, so every rank's pool is the same;
- slots are capped at --max-running-requests (16 without it, as on the CPU): the exchange's
  buffers and the decode graph buckets are sized from that number before any worker starts.

Pure arithmetic, tested on the CPU with made-up figures.
"""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.afd.args import AfdArgs
from minisgl.afd.buckets import lane_prompt_tokens, step_bucket
from minisgl.afd.protocol import WarmupStep
from minisgl.afd.warmup import micro_batches
from minisgl.engine.plan import EnginePlan
from minisgl.engine.warmup import decode_shapes, prefill_shapes
from minisgl.kvcache.planner import GIB, MemoryBudget, PoolCosts, PoolDoesNotFit, PoolPlan, plan_pool


@dataclass(frozen=True)
class WorkerMemory:
    """One worker's figures, measured on its device after the probe steps."""

    worker: str
    lane: int | None  # the attention lane; None for an expert worker
    device: str  # the physical device (host and GPU id): workers naming the same one share it
    free: int  # free bytes on the device once every worker on it is loaded and has let go of its cache
    step_reserve: int  # its largest step's peak activations (an attention worker's: its largest prefill)
    costs: PoolCosts | None = None  # an attention worker's slot, page and decode-row costs

    def __post_init__(self) -> None:
        if (self.lane is None) != (self.costs is None):
            raise ValueError(f"{self.worker}: an attention worker (lane set) needs its pool costs, an expert none")


@dataclass(frozen=True)
class DeviceShare:
    """What one attention worker may take of its device."""

    budget: MemoryBudget  # the device's: free, every worker's reserve on it, the fraction
    sharers: tuple[str, ...]  # every worker on the device
    attention_workers: int

    @property
    def usable(self) -> int:
        return self.budget.usable // self.attention_workers


def device_share(figures: list[WorkerMemory], device: str, fraction: float) -> DeviceShare:
    on = [f for f in figures if f.device == device]
    budget = MemoryBudget(min(f.free for f in on), sum(f.step_reserve for f in on), fraction)
    return DeviceShare(budget, tuple(f.worker for f in on), sum(f.lane is not None for f in on))


@dataclass(frozen=True)
class LanePool:
    """A lane's planned pool and the figures it came from (the tightest rank's share)."""

    lane: int
    share: DeviceShare
    costs: PoolCosts
    plan: PoolPlan

    def describe(self) -> str:
        """The planner's log line, as the colocated engine's (engine/device_memory.py)."""
        p, b, g = self.plan, self.share.budget, GIB
        return (
            f"AFD lane {self.lane} memory: KV {p.kv_bytes / g:.2f} GiB ({p.num_pages} pages), state "
            f"{p.state_bytes / g:.2f} GiB ({p.max_running_requests} slots), decode rows {p.row_reserve_bytes / g:.2f} "
            f"GiB ({self.costs.row_bytes / 2**20:.1f} MiB per running request); device shared by "
            f"{', '.join(self.share.sharers)}: {b.free / g:.2f} GiB free with every worker loaded, less their "
            f"largest steps {b.step_reserve / g:.2f} GiB, x {b.fraction} / {self.share.attention_workers} attention "
            f"worker(s) = {self.share.usable / g:.2f} GiB for this pool; max concurrency "
            f"{p.max_concurrency(p.max_seq_len, self.costs.page_size)} at {p.max_seq_len} tokens"
            + "".join(f"; {n}" for n in p.notes)
        )


def plan_lane(
    figures: list[WorkerMemory], lane: int, fraction: float, model_max_len: int, context_length: int | None,
    max_running_requests: int, state_ratio: float,
) -> LanePool:
    """Lane `lane`'s pool from every worker's figures; PoolDoesNotFit names the lane and its share."""
    ranks = [f for f in figures if f.lane == lane]
    if not ranks:
        raise ValueError(f"no figures from attention lane {lane}")
    share = min((device_share(figures, f.device, fraction) for f in ranks), key=lambda s: s.usable)
    each = [f.costs for f in ranks]
    costs = PoolCosts(max(c.slot_bytes for c in each), max(c.row_bytes for c in each),
                      max(c.page_bytes for c in each), each[0].page_size)
    try:
        plan = plan_pool(costs, share.usable, model_max_len, context_length, max_running_requests, state_ratio)
    except PoolDoesNotFit as e:
        raise PoolDoesNotFit(
            f"AFD lane {lane}: {e}; its device is shared by {', '.join(share.sharers)} "
            f"({share.attention_workers} attention worker(s) split it): fewer workers per GPU (--afd-gpus) leave more"
        ) from None
    return LanePool(lane, share, costs, plan)


def probe_steps(plan: EnginePlan, afd: AfdArgs, max_prefill_tokens: int) -> tuple[WarmupStep, ...]:
    """What every worker runs in lock step before its pool is planned, eagerly: the prefill steps up to
    the most a lane's step holds (the largest step's activations), then decodes of one row and of
    every slot, twice (the second pair, compiled by then, prices a running request's decode row)."""
    chunk, max_len, rows = plan.args.chunked_prefill_size, plan.max_seq_len, plan.pool.max_running_requests
    shapes = [(s, False) for s in prefill_shapes(lane_prompt_tokens(plan, max_prefill_tokens), chunk, max_len)]
    shapes += [(s, True) for s in decode_shapes([1, rows, 1, rows], max_len)]
    steps = []
    for i, (shape, decode) in enumerate(shapes):
        mbs = micro_batches(shape, afd.num_mb, afd.mb_split)
        bucket, _ = step_bucket((), max(mb.num_tokens for mb in mbs), decode)
        steps.append(WarmupStep(i, bucket, False, "decode" if decode else "prefill", mbs))
    return tuple(steps)


@dataclass(frozen=True)
class ProbePeaks:
    """A worker's peaks over the probe steps (in probe_steps' order)."""

    prefill: int  # the largest prefill step
    decode: int  # the largest decode step
    row_bytes: int  # what each decode row adds to a step, from the last decodes of one and of `rows` rows

    @classmethod
    def of(cls, peaks: list[int], rows: int) -> "ProbePeaks":
        prefill, decodes = peaks[:-4], peaks[-4:]
        return cls(max(prefill), max(decodes), max(0, decodes[3] - decodes[2]) // max(1, rows - 1))
