"""The coordinator's workers as one group: their processes (through a Launcher), the sockets that
carry plans to each worker and replies back, the rendezvous store, and how any of it failing
becomes a WorkerFailure that names the worker. Every wait has a deadline; a dead worker's socket
fails a send instead of blocking it."""
from __future__ import annotations

import logging
import os
import pickle
import time
from collections.abc import Callable

import torch.distributed as dist
import zmq

from minisgl.afd.args import AfdArgs
from minisgl.afd.launch import Launcher
from minisgl.afd.protocol import ATTN, EXPERT, Ready, Shutdown, WarmupReply, WarmupStep, WorkerFailed, WorkerSpec
from minisgl.afd.warmup import WarmupReport
from minisgl.engine.plan import EnginePlan
from minisgl.kvcache.hybrid_pool import PoolConfig

logger = logging.getLogger(__name__)
_POLL_MS = 100
_SEND_TIMEOUT_MS = 2000
_START_TIMEOUT_S = 600.0
_BLAME_WINDOW_S = 2.0  # how long a live worker's collective error waits for the dead peer behind it


class WorkerFailure(RuntimeError):
    """A worker died, reported an error, or did not answer in time."""


def plans_pools(plan: EnginePlan, devices: list[str]) -> bool:
    """On GPUs without --num-pages the attention workers plan their pools from measured memory
    (afd/pool_sizing.py); on the CPU, or with --num-pages, the flags size them."""
    return plan.args.num_pages is None and any(d.startswith("cuda") for d in devices)


def lane_pool(lane: str, members: list[str], ready: dict[str, Ready], flags: PoolConfig) -> PoolConfig:
    """The pool a lane's ranks planned (each from the lane's tightest rank, so all agree), or the flags'."""
    pools = {ready[m].pool for m in members}
    if len(pools) > 1:
        raise WorkerFailure(f"AFD lane {lane}'s ranks planned different pools: "
                            + "; ".join(f"{m} {ready[m].pool}" for m in members))
    return pools.pop() or flags


class WorkerGroup:
    """Starts every worker (attention lanes' ranks first, then the expert workers) and returns once
    all have said they are ready with the same decode graph buckets: every rank must be able to
    replay the shape of every graph step. warm_up() then runs the warm-up steps, within the same
    start-up deadline."""

    def __init__(self, plan: EnginePlan, afd: AfdArgs, launcher: Launcher, max_bucket: int,
                 probe_steps: tuple[WarmupStep, ...] = ()) -> None:
        """max_bucket: the largest dispatch bucket any step uses (buckets.largest_bucket);
        probe_steps: what the workers run before the attention workers plan their pools, where they
        do (plans_pools; pool_sizing.probe_steps)."""
        self.devices = devices = launcher.devices(afd)
        if not plans_pools(plan, devices):
            probe_steps = ()
        afd.resolved_transport(devices)  # refuses ipc off CUDA before anything starts
        self.launcher: Launcher | None = launcher
        self.zmq = zmq.Context.instance()
        self.reply_sock = self.zmq.socket(zmq.PULL)
        reply_port = self.reply_sock.bind_to_random_port(f"tcp://{launcher.host}")
        self.store = dist.TCPStore(launcher.host, 0, is_master=True, wait_for_workers=False)
        self.plan_socks: dict[str, zmq.Socket] = {}
        specs = []
        # Each lane's TP ranks are consecutive (one node's GPUs); the plan of a lane goes to each of them.
        roles = [(ATTN, i, j) for i in range(afd.attn_workers) for j in range(afd.attn_tp_size)]
        roles += [(EXPERT, r, 0) for r in range(afd.expert_workers)]
        for rank, (role, index, tp_rank) in enumerate(roles):
            sock = self.zmq.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)
            port = sock.bind_to_random_port(f"tcp://{launcher.host}")
            spec = WorkerSpec(
                role, index, rank, (launcher.host, self.store.port), f"tcp://{launcher.host}:{port}",
                f"tcp://{launcher.host}:{reply_port}", plan, afd, devices[rank],
                parent_pid=None if afd.launcher == "ray" else os.getpid(), tp_rank=tp_rank, max_bucket=max_bucket,
                probe_steps=probe_steps,
            )
            self.plan_socks[spec.name] = sock
            specs.append(spec)
        self.ag_names = [s.name for s in specs if s.role == ATTN and s.tp_rank == 0]  # one per lane
        self.lane_members = {n: [s.name for s in specs if s.role == ATTN and s.name.split(".")[0] == n]
                             for n in self.ag_names}
        self.eg_names = [s.name for s in specs if s.role == EXPERT]
        launcher.start(specs)
        ready: dict[str, Ready] = {}
        self.start_deadline = deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            while len(ready) < len(specs):
                msg = self.recv(deadline, "at start-up", lambda: [s.name for s in specs if s.name not in ready],
                                with_reason=True)
                if isinstance(msg, Ready):
                    ready[msg.worker] = msg
            if len({r.graph_buckets for r in ready.values()}) > 1:
                raise WorkerFailure("AFD workers prepared different decode graph buckets: "
                                    + "; ".join(f"{s.name} {list(ready[s.name].graph_buckets)}" for s in specs))
            self.lane_pools: list[PoolConfig] = [lane_pool(n, self.lane_members[n], ready, plan.pool) for n in self.ag_names]
        except BaseException:  # nobody gets a handle to close: stop the ones that did start
            self.close(graceful=False)
            raise
        self.memory = {n: ready[n].memory for n in self.ag_names if ready[n].memory}  # each lane's planner line
        self.graph_buckets: tuple[int, ...] = ready[specs[0].name].graph_buckets
        logger.info("AFD: %d attention + %d expert workers ready; decode graph buckets %s",
                    afd.attn_workers, afd.expert_workers, list(self.graph_buckets) or "none")

    def warm_up(self, steps: list[WarmupStep]) -> WarmupReport:
        """Send every worker every warm-up step, in order, and gather each one's reply to each step.
        The steps' collectives keep the workers in lock step; a worker that fails one fails the
        start with its reason, and every worker is stopped."""
        started = time.monotonic()
        replies: dict[int, dict[str, WarmupReply]] = {step.step: {} for step in steps}
        try:
            for step in steps:
                data = pickle.dumps(step)
                for name in self.names:
                    self.send(name, data)
            for step in steps:
                got = replies[step.step]
                while len(got) < len(self.names):
                    msg = self.recv(self.start_deadline, "in the warm-up",
                                    lambda: [n for n in self.names if n not in got], with_reason=True)
                    if not isinstance(msg, WarmupReply) or msg.step not in replies:
                        raise WorkerFailure(f"AFD warm-up: unexpected message from a worker: {msg!r:.200}")
                    replies[msg.step][msg.worker] = msg
        except BaseException:
            self.close(graceful=False)
            raise
        return WarmupReport(len(steps), time.monotonic() - started, tuple(replies[step.step] for step in steps))

    @property
    def names(self) -> list[str]:
        """Every worker, each lane's TP ranks included: each gets every step's plan and replies."""
        return list(self.plan_socks)

    def dead(self) -> list[str]:
        return self.launcher.dead() if self.launcher is not None else []

    def recv(
        self, deadline: float, waiting_for: str, awaited: Callable[[], list[str]], with_reason: bool = False
    ) -> object:
        """The next message from any worker; raises WorkerFailure on a death, an error or the
        deadline. Its message names the workers and what became of them; a live worker's error
        (transport internals, addresses) goes to the log only, unless `with_reason` (at start-up,
        where the first worker to fail says why: a load or a graph capture that failed)."""
        while True:
            if self.reply_sock.poll(_POLL_MS):
                msg = pickle.loads(self.reply_sock.recv())
                if isinstance(msg, WorkerFailed):
                    logger.error("AFD worker %s failed: %s: %s", msg.worker, msg.error_type, msg.message)
                    if with_reason:
                        raise WorkerFailure(f"AFD worker {msg.worker} failed {waiting_for}: "
                                            f"{msg.error_type}: {msg.message}")
                    # A peer's death usually surfaces first as a collective error on a live worker:
                    # give the dead one a moment to be seen, and name it instead.
                    until = time.monotonic() + _BLAME_WINDOW_S
                    while not (dead := self.dead()) and time.monotonic() < until:
                        time.sleep(0.05)
                    raise WorkerFailure(describe_dead(dead) if dead else
                                        f"AFD worker {msg.worker} failed ({msg.error_type}; see the server log)")
                return msg
            dead = self.dead()
            if dead:
                raise WorkerFailure(describe_dead(dead))
            if time.monotonic() > deadline:
                raise WorkerFailure(f"AFD workers {', '.join(awaited())} did not answer {waiting_for} in time")

    def send(self, worker: str, data: bytes) -> None:
        try:
            self.plan_socks[worker].send(data)
        except zmq.Again:
            raise WorkerFailure("; ".join(self.dead()) or f"worker {worker} stopped taking plans") from None

    def kill(self) -> None:
        """After a failure: the lock-stepped workers cannot go on, so stop them without waiting."""
        if self.launcher is not None:
            self.launcher.stop(timeout_s=0)

    def close(self, graceful: bool) -> None:
        """Stop the workers (`graceful`: tell each to retire its steps and exit first) and close
        the sockets. Idempotent."""
        if self.launcher is None:
            return
        if graceful:
            try:
                for name in self.plan_socks:
                    self.send(name, pickle.dumps(Shutdown()))
            except WorkerFailure as e:
                logger.warning("AFD shutdown: %s", e)
        self.launcher.stop(timeout_s=10 if graceful else 0)  # only told workers exit on their own
        self.launcher = None
        for sock in self.plan_socks.values():
            sock.close()
        self.reply_sock.close()


def describe_dead(lines: list[str]) -> str:
    return "AFD " + "; ".join(lines)
