"""The coordinator sizes each lane's allocator from the pool its workers report in Ready (their
planned one on GPUs without --num-pages; the flags' otherwise), with a launcher that starts no
process: it answers every spec with a Ready at once."""
from __future__ import annotations

import pickle

import pytest
import zmq

from minisgl.afd.args import AfdArgs
from minisgl.afd.coordinator import Coordinator
from minisgl.afd.protocol import Ready, WorkerSpec
from minisgl.afd.worker_group import WorkerFailure
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.kvcache.hybrid_pool import PoolConfig


class _ReadyLauncher:
    """Every worker says ready at once, an attention worker with the pool given for it."""

    host = "127.0.0.1"

    def __init__(self, device: str, pools: dict[str, PoolConfig]) -> None:
        self.device, self.pools = device, pools
        self.specs: list[WorkerSpec] = []
        self.socks: list[zmq.Socket] = []

    def devices(self, afd: AfdArgs) -> list[str]:
        return [self.device] * afd.world_size

    def start(self, specs: list[WorkerSpec]) -> None:
        ctx = zmq.Context.instance()
        for spec in specs:
            self.specs.append(spec)
            plans, replies = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
            plans.connect(spec.plan_addr)
            replies.connect(spec.reply_addr)
            pool = self.pools.get(spec.name)
            replies.send(pickle.dumps(Ready(spec.name, (), pool, f"{spec.name} planned" if pool else "")))
            self.socks += [plans, replies]

    def dead(self) -> list[str]:
        return []

    def stop(self, timeout_s: float) -> None:
        for sock in self.socks:
            sock.close(linger=0)


def _plan(tiny_checkpoints):
    return resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", max_running_requests=16,
                                   context_length=1024, page_size=16))


def test_each_lane_takes_its_own_planned_pool(tiny_checkpoints) -> None:
    pools = {"attn0": PoolConfig(12, 512, 16, num_pages=300), "attn1": PoolConfig(8, 256, 16, num_pages=200)}
    launcher = _ReadyLauncher("cuda:0", pools)
    coord = Coordinator(_plan(tiny_checkpoints), AfdArgs(attn_workers=2, warmup="off"), launcher=launcher)
    try:
        assert all(s.probe_steps for s in launcher.specs)  # GPUs without --num-pages: every worker probes
        assert [(l.alloc.max_running, l.alloc.total_pages) for l in coord.lanes] == [(12, 300), (8, 200)]
        assert coord.max_seq_len == 256  # a request may go to either lane: the shorter one's
        assert (coord.info.max_seq_len, coord.info.total_pages, coord.info.max_running_requests) == (256, 500, 20)
        assert coord.workers.memory == {"attn0": "attn0 planned", "attn1": "attn1 planned"}
    finally:
        coord.close()


def test_flags_size_the_lanes_on_the_cpu(tiny_checkpoints) -> None:
    launcher = _ReadyLauncher("cpu", {})
    coord = Coordinator(_plan(tiny_checkpoints), AfdArgs(attn_workers=2), launcher=launcher)
    try:
        assert not any(s.probe_steps for s in launcher.specs)
        # 16 slots, each with 1024 / 16 = 64 pages.
        assert [(l.alloc.max_running, l.alloc.total_pages) for l in coord.lanes] == [(16, 1024)] * 2
        assert coord.max_seq_len == 1024
    finally:
        coord.close()


def test_num_pages_pins_the_gpu_lanes(tiny_checkpoints) -> None:
    plan = resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", max_running_requests=4,
                                   context_length=256, page_size=16, num_pages=40))
    launcher = _ReadyLauncher("cuda:0", {})
    coord = Coordinator(plan, AfdArgs(warmup="off"), launcher=launcher)
    try:
        assert not any(s.probe_steps for s in launcher.specs)
        assert [(l.alloc.max_running, l.alloc.total_pages) for l in coord.lanes] == [(4, 40)]
    finally:
        coord.close()


def test_a_lanes_ranks_must_agree(tiny_checkpoints) -> None:
    pools = {"attn0": PoolConfig(12, 512, 16, num_pages=300), "attn0.tp1": PoolConfig(12, 512, 16, num_pages=299)}
    with pytest.raises(WorkerFailure, match="AFD lane attn0's ranks planned different pools"):
        Coordinator(_plan(tiny_checkpoints), AfdArgs(attn_tp_size=2, warmup="off"),
                    launcher=_ReadyLauncher("cuda:0", pools))
