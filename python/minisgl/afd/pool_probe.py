"""The device side of sizing the AFD pools (afd/pool_sizing.py): after the probe steps, let go of
the cache, wait for every worker to have done so (every worker on a device has loaded its weights
by then), read what is free, share the figures, and plan this worker's lane."""
from __future__ import annotations

import gc
import logging
import socket

import torch
import torch.distributed as dist

from minisgl.afd.pool_sizing import LanePool, ProbePeaks, WorkerMemory, plan_lane
from minisgl.afd.protocol import ATTN, WarmupReply, WorkerSpec
from minisgl.engine.args import DEFAULT_MEM_FRACTION
from minisgl.kvcache.planner import PoolCosts

logger = logging.getLogger(__name__)


def read_device(device: torch.device) -> tuple[int, str]:
    """What is free on the GPU, and the GPU itself, whatever this process calls it (a Ray actor sees
    its own GPU as cuda:0)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free, f"{socket.gethostname()}/{torch.cuda.get_device_properties(device).uuid}"


def plan_after_probe(spec: WorkerSpec, runner: object, replies: list[WarmupReply]) -> LanePool | None:
    """Every worker calls this after the probe steps, in lock step; an attention worker gets its
    lane's pool (None for an expert worker). `runner` is the worker's AttentionWorker or ExpertWorker."""
    plan = spec.engine_plan.on_device(spec.device)
    peaks = ProbePeaks.of([r.peak_bytes for r in replies], plan.pool.max_running_requests)
    costs, lane = None, None
    if spec.role == ATTN:
        lane, reserve = spec.index, peaks.prefill
        # A decode graph's private pool holds the model's activations at its bucket once more, and its
        # logits buffer a fp32 row per request (as engine/device_memory.py prices a colocated graph).
        row = peaks.row_bytes * 2 + plan.config.vocab_size * 4 if runner.captures else peaks.row_bytes
        flags = plan.pool
        costs = PoolCosts.of(runner.engine.layout, flags, plan.dtype, row)
        runner.engine.drop_pool()  # the scratch pool: what is free is measured without it
    else:
        # No pool, but its largest step's activations stay reserved, and its decode graphs' pool beside.
        reserve = max(peaks.prefill, peaks.decode) + (peaks.decode if runner.captures else 0)
    gc.collect()
    torch.cuda.empty_cache()
    dist.barrier()  # every worker has loaded and let go of its cache: what is free is what the pools may take
    free, where = read_device(plan.device)
    mine = WorkerMemory(spec.name, lane, where, free, reserve, costs)
    figures: list[WorkerMemory | None] = [None] * dist.get_world_size()
    dist.all_gather_object(figures, mine)  # after every read: no pool is allocated before
    if lane is None:
        return None
    args = plan.args
    pool = plan_lane(figures, lane, args.mem_fraction_static or DEFAULT_MEM_FRACTION,
                     plan.config.max_position_embeddings, args.context_length, plan.pool.max_running_requests,
                     args.mamba_full_memory_ratio)
    logger.info("%s", pool.describe())
    return pool
