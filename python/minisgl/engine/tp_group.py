"""Colocated tensor parallelism: this process is TP rank 0 and runs the scheduler; ranks 1..N-1 are
follower processes that run the same forward on their shards, one step message at a time.

Why the scheduler stays on rank 0 instead of every rank running the same plan:
- the request state (sampling parameters and generators, stop strings and their detokenizer,
  logprobs, aborts from the server) lives in one process, so nothing can drift between ranks and
  the followers need no tokenizer;
- a step message is small: the pool's table changes since the last step and the batch's shape
  (extend and prefix lengths, slots), never the prompt tokens;
- sampling is identical across ranks by construction: only rank 0 samples, and each step's input
  ids (including the decode tokens that, under overlap, exist only on rank 0's device) reach the
  other ranks in one broadcast at the start of the forward, inside the CUDA graph on decode.

Followers wait for step messages on ZMQ (they may idle for hours; collectives have timeouts), and
exit when rank 0's process is gone.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Protocol, Sequence

import torch
import torch.distributed as dist
import zmq

from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import EnginePlan
from minisgl.forward_batch import ForwardBatch, Snapshot
from minisgl.kvcache.hybrid_pool import HybridPool
from minisgl.parallel.config import ParallelConfig

logger = logging.getLogger(__name__)

# A collective waits this long for a peer: model loading on the ranks finishes at different times
# before the first collective of the warm-up.
COLLECTIVE_TIMEOUT_S = 1800.0
JOIN_TIMEOUT_S = 600.0  # followers' start, model build and load, reported through the store
_POLL_S = 0.05
_SEND_TIMEOUT_MS = 2000
_IDLE_POLL_MS = 500


def rank_devices(dev: torch.device, tp_size: int) -> list[str]:
    """The device of each TP rank: consecutive GPUs from `dev` (cuda:k -> k), or the CPU for all.
    More ranks than GPUs is an error, raised before anything starts."""
    if dev.type == "cpu":
        return ["cpu"] * tp_size
    if dev.type != "cuda":
        raise ValueError(f"tensor parallelism runs on cuda or cpu devices, not {dev.type!r}")
    first = dev.index or 0
    have = torch.cuda.device_count()
    if first + tp_size > have:
        raise ValueError(
            f"--tp-size {tp_size} needs {tp_size} CUDA devices starting at cuda:{first}, but this host has {have}"
        )
    return [f"cuda:{first + r}" for r in range(tp_size)]


# -- messages -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolOp:
    """One change rank 0 made to its pool's device tables, replayed by the followers in order."""

    kind: str  # "assign" | "reset" | "clear" | "copy" (slot's state := that of slot `start`)
    slot: int
    start: int = 0
    pages: tuple[int, ...] = ()


@dataclass(frozen=True)
class TpStep:
    """What a follower needs to run rank 0's next forward: the table changes before it and the
    batch's shape. Token ids (and logit rows) arrive by broadcast inside the forward."""

    pool_ops: tuple[PoolOp, ...]
    prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]
    slots: tuple[int, ...]
    num_rows: int | None  # logit rows asked for; None = each request's last token
    snapshots: tuple[Snapshot, ...] = ()  # states the prefix cache keeps from inside the step

    def __post_init__(self) -> None:
        if not (len(self.prefix_lens) == len(self.extend_lens) == len(self.slots)) or not self.slots:
            raise ValueError("a TP step needs one prefix length, extend length and slot per request, and >= 1 request")


@dataclass(frozen=True)
class TpShutdown:
    """Tells a follower to leave its loop."""


class JournaledPool(HybridPool):
    """Rank 0's pool: every change to the device tables is also recorded, to travel with the next
    step message so the followers' tables stay identical."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._ops: list[PoolOp] = []

    def assign_pages(self, slot: int, start: int, pages: list[int]) -> None:
        super().assign_pages(slot, start, pages)
        if pages:
            self._ops.append(PoolOp("assign", slot, start, tuple(pages)))

    def reset_slot(self, slot: int) -> None:
        super().reset_slot(slot)
        self._ops.append(PoolOp("reset", slot))

    def clear_slot(self, slot: int) -> None:
        super().clear_slot(slot)
        self._ops.append(PoolOp("clear", slot))

    def copy_state(self, src: int, dst: int) -> None:
        super().copy_state(src, dst)
        self._ops.append(PoolOp("copy", dst, src))

    def take_ops(self) -> tuple[PoolOp, ...]:
        ops, self._ops = tuple(self._ops), []
        return ops


def apply_ops(pool: HybridPool, ops: tuple[PoolOp, ...]) -> None:
    for op in ops:
        if op.kind == "assign":
            pool.assign_pages(op.slot, op.start, list(op.pages))
        elif op.kind == "reset":
            pool.reset_slot(op.slot)
        elif op.kind == "copy":
            pool.copy_state(op.start, op.slot)
        else:
            pool.clear_slot(op.slot)


# -- the followers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FollowerSpec:
    rank: int
    plan: EnginePlan  # on this rank's device
    store_addr: tuple[str, int]
    step_addr: str
    max_prefill_tokens: int
    parent_pid: int


# Each follower's progress in the store: JOINING once it is about to join the process group, READY
# once its shard is loaded (and warmed up), or the error it failed with.
JOINING, READY = "joining", "ready"


def status_key(rank: int) -> str:
    return f"tp_status_{rank}"


def init_group(backend: str, store: dist.Store, rank: int, args: EngineArgs) -> ParallelConfig:
    dist.init_process_group(backend, store=store, rank=rank, world_size=args.tp_size,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return ParallelConfig(args.tp_size, rank, args.ep_size, tuple(range(args.tp_size)), dist.group.WORLD)


class FollowerEngine(Protocol):
    """What a follower's loop drives: its engine's pool, batches and forward."""

    pool: HybridPool
    device: torch.device

    def make_batch(self, tokens: list[list[int]], prefix_lens: list[int], slots: list[int],
                   snapshots: Sequence[Snapshot] = ()) -> ForwardBatch: ...

    def forward_batch(self, batch: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor: ...


def follow(engine: FollowerEngine, sock: zmq.Socket, parent_pid: int) -> None:
    """Run rank 0's steps until it says stop or is gone."""
    while True:
        if not sock.poll(_IDLE_POLL_MS):
            if os.getppid() != parent_pid:
                logger.error("TP rank 0 (pid %d) is gone; exiting", parent_pid)
                return
            continue
        msg = pickle.loads(sock.recv())
        if isinstance(msg, TpShutdown):
            return
        apply_ops(engine.pool, msg.pool_ops)
        batch = engine.make_batch([[0] * n for n in msg.extend_lens], list(msg.prefix_lens), list(msg.slots),
                                  msg.snapshots)
        rows = None if msg.num_rows is None else torch.zeros(msg.num_rows, dtype=torch.int64, device=engine.device)
        engine.forward_batch(batch, rows)


# -- rank 0's end ---------------------------------------------------------------------------------
class TpGroup:
    """Starts the followers, joins the process group as rank 0, and sends them each step.
    `entry(spec)` is a follower process's main (engine.follower_main, which builds its Engine)."""

    def __init__(self, plan: EnginePlan, max_prefill_tokens: int, entry: Callable[[FollowerSpec], None]) -> None:
        args = plan.args
        if dist.is_initialized():
            raise ValueError("--tp-size > 1 starts its own process group, but this process already has one")
        self.devices = rank_devices(plan.device, args.tp_size)
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=JOIN_TIMEOUT_S))
        self.zmq = zmq.Context.instance()
        self.socks: list[zmq.Socket] = []
        self.procs: list[mp.process.BaseProcess] = []
        ctx = mp.get_context("spawn")  # fork would copy this process's threads and CUDA state
        for rank in range(1, args.tp_size):
            sock = self.zmq.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)  # a dead follower must fail the send, not block it
            port = sock.bind_to_random_port("tcp://127.0.0.1")
            spec = FollowerSpec(rank, plan.on_device(self.devices[rank]), ("127.0.0.1", self.store.port),
                                f"tcp://127.0.0.1:{port}", max_prefill_tokens, os.getpid())
            proc = ctx.Process(target=entry, args=(spec,), name=f"minisgl-tp{rank}", daemon=True)
            proc.start()
            self.socks.append(sock)
            self.procs.append(proc)
        device = torch.device(self.devices[0])
        if device.type == "cuda":
            torch.cuda.set_device(device)
        try:
            self.wait_for(JOINING)  # a follower that cannot start must not leave the rendezvous waiting
            self.parallel = init_group("nccl" if device.type == "cuda" else "gloo", self.store, 0, args)
        except BaseException:
            self.close(timeout_s=0)
            raise

    def dead(self) -> list[str]:
        """A line per follower that has exited, with the error it reported, if any."""
        out = []
        for r, p in enumerate(self.procs, start=1):
            if p.exitcode is not None:
                key = status_key(r)
                said = self.store.get(key).decode() if self.store.check([key]) else READY
                out.append(f"TP rank {r} (pid {p.pid}) exited with code {p.exitcode}"
                           + ("" if said in (JOINING, READY) else f": {said}"))
        return out

    def wait_for(self, state: str) -> None:
        """Until every follower has reached `state` (JOINING, then READY once its shard is built and
        loaded); raises with a follower's own error, or its exit."""
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        reached = (JOINING, READY) if state == JOINING else (READY,)
        ranks = range(1, len(self.procs) + 1)
        while True:
            dead = self.dead()
            if dead:
                raise RuntimeError("; ".join(dead))
            status = {r: self.store.get(status_key(r)).decode() for r in ranks if self.store.check([status_key(r)])}
            failed = [f"TP rank {r} failed: {s}" for r, s in status.items() if s not in (JOINING, READY)]
            if failed:
                raise RuntimeError("; ".join(failed))
            if all(status.get(r) in reached for r in ranks):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"TP ranks not {state} within {JOIN_TIMEOUT_S:.0f} s: {status}")
            time.sleep(_POLL_S)

    def send(self, msg: TpStep | TpShutdown) -> None:
        dead = self.dead()
        if dead:
            raise RuntimeError("; ".join(dead))
        data = pickle.dumps(msg)
        try:
            for sock in self.socks:
                sock.send(data)
        except zmq.Again:
            raise RuntimeError("; ".join(self.dead()) or "a TP rank stopped taking steps") from None

    def close(self, timeout_s: float = 10.0) -> None:
        if not self.dead():
            try:
                self.send(TpShutdown())
            except RuntimeError as e:
                logger.warning("TP shutdown: %s", e)
        for p in self.procs:
            p.join(timeout_s)
            if p.is_alive():
                p.kill()
                p.join(5)
        for sock in self.socks:
            sock.close()
        if dist.is_initialized():
            dist.destroy_process_group()
