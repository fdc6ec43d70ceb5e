"""Sharded engines on local gloo ranks for the TP/EP tests, without a process start per case.

`RankHosts` starts WORLD processes once; they join one gloo world and build a group of the first
2 and of all 4 ranks. Each case runs on the first `tp` ranks: every rank builds its shard of the
engine (Engine(plan, parallel=...)) and drives the same scheduler over the same requests (the
"every rank runs the same plan" mode, which also checks that sampling agrees across ranks); rank 0
reports the tokens and every step's logits. The launcher path (rank 0 scheduling, followers fed
step messages) is tested separately through LLM(tp_size=...).
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import sys
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from minisgl.scheduler.args import SchedulerArgs

WORLD = 4
_CASE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Case:
    path: str
    tp: int
    ep: int = 1
    engine: dict = field(default_factory=dict)
    prompts: tuple[tuple[int, ...], ...] = ()
    max_tokens: int = 32
    max_prefill_tokens: int = SchedulerArgs.max_prefill_tokens  # the step budget (small: prompts split into chunks)


@dataclass
class Result:
    tokens: list[list[int]]
    logits: list[torch.Tensor]  # per step, the rows that sampled
    extend_lens: list[tuple[int, ...]] = field(default_factory=list)  # per step, tokens each request fed
    error: str | None = None


def generate(engine, prompts, max_tokens: int, max_prefill_tokens: int = SchedulerArgs.max_prefill_tokens) -> Result:
    """Greedy tokens of every prompt through the colocated Scheduler, and each step's logits."""
    from minisgl.sampling_params import SamplingParams
    from minisgl.scheduler.messages import GenerateRequest
    from minisgl.scheduler.scheduler import Scheduler

    steps: list[torch.Tensor] = []
    shapes: list[tuple[int, ...]] = []
    forward = engine.forward_batch

    def recording(batch, rows=None):
        out = forward(batch, rows)
        steps.append(out.detach().clone())
        shapes.append(batch.extend_lens)
        return out

    engine.forward_batch = recording
    try:
        sched = Scheduler(engine, args=SchedulerArgs(max_prefill_tokens=max_prefill_tokens), overlap=False)
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        for i, p in enumerate(prompts):
            sched.add_request(GenerateRequest(f"r{i}", tuple(p), params))
        tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
        while sched.has_work:
            for out in sched.step():
                tokens[out.rid] += out.new_token_ids
        sched.check_integrity()
    finally:
        del engine.forward_batch  # the class's method again
    return Result([tokens[f"r{i}"] for i in range(len(prompts))], steps, shapes)


def _host(rank: int, port: int, inbox: mp.Queue, results: mp.Queue) -> None:
    import torch.distributed as dist

    from minisgl.engine.args import EngineArgs
    from minisgl.engine.engine import Engine
    from minisgl.engine.plan import resolve_plan
    from minisgl.parallel.config import ParallelConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=_CASE_TIMEOUT_S))
    groups = {n: dist.new_group(list(range(n))) for n in (2, WORLD)}
    while (case := inbox.get()) is not None:
        if rank >= case.tp:
            continue
        try:
            pc = ParallelConfig(case.tp, rank, case.ep, tuple(range(case.tp)), groups[case.tp])
            engine = Engine(resolve_plan(EngineArgs(case.path, **case.engine)), parallel=pc)
            result = generate(engine, case.prompts, case.max_tokens, case.max_prefill_tokens)
        except BaseException:  # noqa: BLE001 - report, then leave: the peers' collectives fail fast
            results.put((rank, Result([], [], traceback.format_exc())))
            sys.exit(1)
        if rank == 0:
            results.put((rank, result))
    dist.destroy_process_group()


class RankHosts:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.results: mp.Queue = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(WORLD)]
        self.procs = [ctx.Process(target=_host, args=(r, port, self.inboxes[r], self.results), daemon=True)
                      for r in range(WORLD)]
        for p in self.procs:
            p.start()

    def run(self, case: Case) -> Result:
        dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
        if dead:
            raise AssertionError(f"rank hosts {dead} exited in an earlier case")
        for inbox in self.inboxes:
            inbox.put(case)
        try:
            rank, result = self.results.get(timeout=_CASE_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"no result within {_CASE_TIMEOUT_S:.0f} s for {case}") from None
        if result.error:
            raise AssertionError(f"rank {rank} failed:\n{result.error}")
        return result

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())
