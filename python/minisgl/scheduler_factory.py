"""The one place that turns flags into a RequestScheduler: the colocated Scheduler over an Engine,
or, with --afd, the coordinator over attention and expert worker processes."""
from __future__ import annotations

from dataclasses import replace

from minisgl.afd.args import AfdArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import EnginePlan
from minisgl.scheduler.args import SchedulerArgs
from minisgl.scheduler.protocol import RequestScheduler
from minisgl.scheduler.scheduler import Scheduler
from minisgl.scheduler.stop import DecoderFactory


def build_scheduler(
    plan: EnginePlan,
    afd: AfdArgs | None = None,
    make_decoder: DecoderFactory | None = None,
    sched_args: SchedulerArgs = SchedulerArgs(),
) -> RequestScheduler:
    if afd is not None:
        from minisgl.afd.coordinator import Coordinator

        # The lanes keep no prefix cache (the workers do not copy states); their plans, re-resolved
        # from the flags on each worker's device, must say so too.
        plan = replace(plan, args=replace(plan.args, enable_prefix_caching=False),
                       pool=replace(plan.pool, prefix_cache=False, cache_slots=0))
        return Coordinator(plan, afd, make_decoder, sched_args)
    return Scheduler(Engine(plan, max_prefill_tokens=sched_args.max_prefill_tokens), make_decoder, sched_args)
