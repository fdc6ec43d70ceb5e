"""A worker process: its entry point, the control channel to the coordinator, and the loop that
keeps at most K launched-but-unretired steps. (The spec it starts from is in afd/protocol.py.)"""
from __future__ import annotations

import logging
import os
import pickle
import sys
import time
import traceback
from collections import deque
from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
import zmq

from minisgl.afd.args import AfdArgs
from minisgl.afd.attention_worker import AttentionWorker
from minisgl.afd.expert_worker import ExpertWorker
from minisgl.afd.pool_probe import plan_after_probe
from minisgl.afd.step_profiler import StepProfiler
from minisgl.afd.transport_choice import process_group_backend
from minisgl.afd.protocol import ATTN, Ready, Reply, Shutdown, WarmupReply, WarmupStep, WorkerFailed, WorkerSpec
from minisgl.engine import compile_watch
from minisgl.engine.device_memory import peak_bytes
from minisgl.parallel.config import SINGLE, ParallelConfig
from minisgl.process_setup import name_process, set_loading_bar, setup_logging

logger = logging.getLogger(__name__)

_IDLE_POLL_MS = 500


class StepRunner(Protocol):
    name: str
    device: torch.device
    graph_buckets: tuple[int, ...]  # the decode buckets it prepared
    captured_graphs: int  # the decode-step CUDA graphs it holds (0 where its graph steps run eagerly)
    captures: bool  # it will capture decode graphs (in the warm-up), which hold memory of their own

    def launch(self, plan: Any) -> Any: ...

    def retire(self, launched: Any) -> Reply: ...

    def warm_up(self, step: WarmupStep) -> None:
        """Run the step to its end, touching only scratch state no request owns."""


class ControlChannel:
    def __init__(self, plan_addr: str, reply_addr: str) -> None:
        self.ctx = zmq.Context.instance()
        self.plans = self.ctx.socket(zmq.PULL)
        self.plans.connect(plan_addr)
        self.replies = self.ctx.socket(zmq.PUSH)
        self.replies.setsockopt(zmq.LINGER, 2000)
        self.replies.connect(reply_addr)

    def recv(self, timeout_ms: int) -> Any | None:
        if not self.plans.poll(timeout_ms):
            return None
        return pickle.loads(self.plans.recv())

    def send(self, msg: object) -> None:
        self.replies.send(pickle.dumps(msg))


def warm_up(runner: StepRunner, step: WarmupStep) -> WarmupReply:
    """Run a warm-up step and measure it: the Triton compiles it caused and, on CUDA, the most it
    allocated beyond what was allocated before it (what a planner must leave free beside the pool);
    for a prefill step, at least the allocator segments it grew by from an empty cache, so the
    reserve holds its fragmentation too (engine/device_memory.peak_bytes)."""
    cuda = runner.device.type == "cuda"
    if cuda:
        compile_watch.install()
    compiles = compile_watch.compile_count()
    peak = None
    with compile_watch.warming_up():
        if cuda:
            peak = peak_bytes(lambda: runner.warm_up(step), segments=step.phase == "prefill")
        else:
            runner.warm_up(step)
    return WarmupReply(step.step, runner.name, peak, compile_watch.compile_count() - compiles, runner.captured_graphs)


def serve(
    runner: StepRunner, chan: ControlChannel, depth: int, parent_pid: int | None, profiler: StepProfiler | None = None
) -> None:
    """Launch plans as they come; once more than `depth` are launched, retire the oldest (so step
    k + depth is enqueued on the device before the host waits for step k's tokens, and a graph
    replay never waits for the host), and retire when idle. Warm-up steps, which come before any
    plan, run to their end at once: each reply carries a measurement."""
    pending: deque[tuple[Any, float]] = deque()  # (launched step, host seconds its launch took)

    def retire() -> Reply:
        launched, launch_s = pending.popleft()
        return replace(runner.retire(launched), launch_s=launch_s)

    while True:
        msg = chan.recv(0 if pending else _IDLE_POLL_MS)
        if msg is None:
            if pending:
                chan.send(retire())
            elif parent_pid is not None and os.getppid() != parent_pid:
                logger.error("coordinator (pid %d) is gone; exiting", parent_pid)
                return
            continue
        if isinstance(msg, Shutdown):
            while pending:
                chan.send(retire())
            if profiler is not None:
                profiler.finish()
            return
        if isinstance(msg, WarmupStep):
            chan.send(warm_up(runner, msg))
            continue
        if profiler is not None:
            profiler.before_step(msg.step)
        started = time.perf_counter()
        launched = runner.launch(msg)
        pending.append((launched, time.perf_counter() - started))
        if len(pending) > depth:  # step k + depth is enqueued before the host waits on step k's tokens
            chan.send(retire())


def init_distributed(spec: WorkerSpec) -> None:
    backend = process_group_backend(spec)
    host, port = spec.store_addr
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=spec.afd_args.step_timeout_s))
    dist.init_process_group(
        backend,
        store=store,
        rank=spec.rank,
        world_size=spec.afd_args.world_size,
        # A dead peer must surface as an error here, never as a hang.
        timeout=timedelta(seconds=spec.afd_args.step_timeout_s),
    )


def lane_groups(afd: AfdArgs) -> list[object]:
    """The process group of each attention lane's TP ranks; every rank makes them, in the same order."""
    if afd.attn_tp_size == 1:
        return []
    tp = afd.attn_tp_size
    return [dist.new_group(list(range(i * tp, (i + 1) * tp))) for i in range(afd.attn_workers)]


def worker_main(spec: WorkerSpec) -> None:
    """Process entry point for one worker."""
    name_process(f"minisgl-{spec.name}")
    setup_logging(spec.name)
    lead = spec.index == 0 and spec.tp_rank == 0  # one loading bar per role, each on its own line
    set_loading_bar(f"Loading weights ({'attention' if spec.role == ATTN else 'experts'})" if lead else None,
                    line=0 if spec.role == ATTN else 1)
    chan = ControlChannel(spec.plan_addr, spec.reply_addr)
    try:
        if spec.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(spec.device))
        else:
            torch.set_num_threads(spec.afd_args.cpu_threads)
        init_distributed(spec)
        lanes = lane_groups(spec.afd_args)
        if spec.role == ATTN:
            tp = spec.afd_args.attn_tp_size
            lane = SINGLE if tp == 1 else ParallelConfig(
                tp, spec.tp_rank, 1, tuple(range(spec.index * tp, (spec.index + 1) * tp)), lanes[spec.index])
            runner: StepRunner = AttentionWorker(spec, lane)
        else:
            runner = ExpertWorker(spec)
        pool, memory = None, ""
        if spec.probe_steps:  # every worker, in lock step: then the attention workers plan their pools
            lane_pool = plan_after_probe(spec, runner, [warm_up(runner, step) for step in spec.probe_steps])
            if lane_pool is not None:
                pool, memory = lane_pool.plan.config(runner.engine.plan.pool), lane_pool.describe()
                runner.allocate_pool(pool)
        chan.send(Ready(spec.name, runner.graph_buckets, pool, memory))
        serve(runner, chan, spec.afd_args.async_pending_steps, spec.parent_pid, StepProfiler.from_env(spec.name))
    except BaseException as e:  # noqa: BLE001 - report any failure to the coordinator, then exit non-zero
        chan.send(WorkerFailed(spec.name, type(e).__name__, str(e)))
        traceback.print_exc()
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
