"""The AFD coordinator: the scheduler for all attention-worker lanes (implements RequestScheduler,
so the server and the offline LLM drive it like the colocated Scheduler).

Each step it plans every lane (decodes, then prefill chunks within the budget, admitting waiting
requests round-robin across lanes while a lane's allocator can reserve their pages and a slot),
splits each lane's requests into micro-batches (evenly by count, or balancing attention context;
`--afd-mb-split`), agrees one dispatch bucket for all ranks (afd/buckets.py),
and sends one plan to every worker. With decode graphs a step is decode-only or prefill-only, as a
graph holds decodes only. It runs `lead = K + 1` steps ahead of the replies: decode
inputs stay on the workers' devices, so it never needs step t's tokens to plan step t + 1. Finish
detection therefore lags; tokens sampled after a request finished are dropped, and its slot is
freed in the next plan, after the steps that still use it in command order.
"""
from __future__ import annotations

import logging
import pickle
import time
from collections import deque
from dataclasses import dataclass, field, replace

from minisgl.afd.args import AfdArgs
from minisgl.afd.buckets import largest_bucket, step_bucket
from minisgl.afd.expert_plan import ExpertPlan
from minisgl.afd.launch import Launcher, make_launcher
from minisgl.afd.launch_times import LaunchTimes
from minisgl.afd.mb_split import split
from minisgl.afd.pool_sizing import probe_steps
from minisgl.afd.protocol import AgPlan, EgPlan, NewRequest, PageAssignment, Reply, ReqStep
from minisgl.afd.warmup import WarmupReport, wanted, warmup_steps
from minisgl.afd.worker_group import WorkerFailure, WorkerGroup, describe_dead
from minisgl.engine.plan import EnginePlan
from minisgl.kvcache.allocator import PoolAllocator
from minisgl.models.sharding import check_parallel
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.args import SchedulerArgs
from minisgl.scheduler.messages import GenerateRequest, RequestOutput, SchedulerInfo, SchedulerStats
from minisgl.scheduler.request import Request
from minisgl.scheduler.rules import (
    abort_request, check_finish, decodable, new_request, plan_batch, take_outputs, validate_request,
)
from minisgl.scheduler.stop import DecoderFactory

logger = logging.getLogger(__name__)


@dataclass
class Lane:
    index: int
    alloc: PoolAllocator
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)
    frees: list[int] = field(default_factory=list)  # slots freed since the last plan


class Coordinator:
    def __init__(
        self,
        plan: EnginePlan,
        afd: AfdArgs,
        make_decoder: DecoderFactory | None = None,
        sched_args: SchedulerArgs = SchedulerArgs(),
        launcher: Launcher | None = None,
    ) -> None:
        self.plan = plan
        engine_args = plan.args
        self.afd = afd
        self.config = config = plan.config
        ExpertPlan(config.num_experts, afd.expert_workers)  # E % N, before anything starts
        if engine_args.tp_size != 1 or engine_args.ep_size != 1:
            raise ValueError("--tp-size and --ep-size shard the colocated engine; with --afd, shard each attention "
                             "lane with --afd-attn-tp-size (the experts are spread over --afd-expert-workers)")
        check_parallel(config, afd.attn_tp_size, 1, flag="--afd-attn-tp-size")
        if afd.num_mb > plan.pool.max_running_requests:
            raise ValueError(
                f"--afd-num-mb {afd.num_mb} exceeds --max-running-requests {plan.pool.max_running_requests}: "
                f"a lane can never fill that many micro-batches"
            )
        self.chunk_size = engine_args.chunked_prefill_size
        self.prefill_budget = sched_args.max_prefill_tokens
        self.per_request = engine_args.prefill_tokens_per_request
        self.eos = frozenset(config.eos_token_ids)
        self.make_decoder = make_decoder
        self._reqs: dict[str, Request] = {}
        self._lane_of: dict[str, Lane] = {}
        self._wire: dict[str, str] = {}  # rid -> wire id, for live requests
        self._by_wire: dict[str, Request] = {}
        self._admitted = 0
        self._rr = 0
        self._outbox: list[RequestOutput] = []
        self._inflight: deque[int] = deque()  # step ids sent and not yet fully replied
        self._replies: dict[int, dict[str, Reply]] = {}
        self._step = 0
        self.graph_steps = 0  # steps planned as decode-graph steps (every rank replays its bucket's graph)
        self._decode_steps: set[int] = set()  # in flight
        self.decode_launch = LaunchTimes()
        self._integrity_checks = 0
        self.failure: str | None = None
        self.plan_bytes: deque[int] = deque(maxlen=64)  # pickled size of recent step plans, all workers
        self.workers: WorkerGroup | None = None  # set once every worker is ready
        self.workers = WorkerGroup(plan, afd, launcher or make_launcher(afd), largest_bucket(plan, self.prefill_budget),
                                   probe_steps(plan, afd, self.prefill_budget))
        self.graph_buckets = self.workers.graph_buckets  # what every worker prepared
        # Each lane's allocator mirrors its worker's pool: the flags' (CPU, --num-pages) or the one it
        # planned, its own (lanes on devices with less free memory plan smaller pools). Requests go
        # to any lane, so the longest one served is the shortest lane's.
        pools = self.workers.lane_pools
        self.lanes = [Lane(i, PoolAllocator(p.max_running_requests, p.usable_pages, p.page_size, p.max_seq_len))
                      for i, p in enumerate(pools)]
        self.max_seq_len = min(p.max_seq_len for p in pools)
        self.info = SchedulerInfo(
            model_path=engine_args.model_path,
            max_seq_len=self.max_seq_len,
            vocab_size=config.vocab_size,
            page_size=plan.pool.page_size,
            total_pages=sum(p.usable_pages for p in pools),
            max_running_requests=sum(p.max_running_requests for p in pools),
            device=f"afd {afd.attn_workers}+{afd.expert_workers}",
            supports_logprobs=False,
        )
        # The warm-up's shapes: the most slots any lane has, up to the longest request served.
        served = replace(plan, pool=replace(plan.pool, max_running_requests=max(p.max_running_requests for p in pools),
                                            max_seq_len=self.max_seq_len,
                                            num_pages=min(p.usable_pages for p in pools)))
        # Before ready: every shape class a step can take, through every worker in lock step.
        self.warmup: WarmupReport | None = None
        if wanted(afd.warmup, self.workers.devices):
            self.warmup = self.workers.warm_up(warmup_steps(served, afd, self.graph_buckets, self.prefill_budget))
            logger.info("%s", self.warmup.describe())
            self.info = replace(self.info, warmup_seconds=self.warmup.seconds,
                                warmup_compiles=sum(self.warmup.compiles().values()))
        self._prefilled_last = False  # graph buckets: the kind of the last step, so the kinds alternate

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close(graceful=self.failure is None)

    # -- RequestScheduler -----------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if self.failure is not None:
            raise RuntimeError(f"AFD workers failed: {self.failure}")
        validate_request(prompt_ids, params, self.max_seq_len, self.config.vocab_size, self.make_decoder is not None)
        if params.logprobs is not None or params.prompt_logprobs is not None:
            raise ValueError("logprobs and prompt_logprobs are not supported in AFD mode yet")

    def add_request(self, req: GenerateRequest) -> None:
        self.validate(list(req.prompt_ids), req.params)
        if req.rid in self._reqs:
            raise ValueError(f"request id {req.rid!r} is already in use")
        r = new_request(req, self.make_decoder)  # sampling happens on the attention worker
        lane = self.lanes[self._rr % len(self.lanes)]
        self._rr += 1
        self._reqs[r.rid] = r
        # Plans and replies name a request by an id never reused, so tokens of steps still in
        # flight for a finished or aborted request can never reach a new request with its rid.
        self._wire[r.rid] = wire = str(self._admitted)
        self._by_wire[wire] = r
        self._admitted += 1
        self._lane_of[r.rid] = lane
        lane.waiting.append(r)

    def abort(self, rid: str) -> None:
        r = self._reqs.get(rid)
        if r is not None:
            self._outbox.append(abort_request(r, self._lane_of[rid].waiting, self._forget, self._release))

    @property
    def has_work(self) -> bool:
        """True while step() has anything to do or report. A worker's death counts: step() then
        raises, so an idle coordinator reports it without waiting for traffic."""
        if self._outbox or self._inflight or any(l.waiting or l.running for l in self.lanes):
            return True
        return self.failure is None and self.workers is not None and bool(self.workers.dead())

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=sum(len(l.running) for l in self.lanes),
            num_waiting=sum(len(l.waiting) for l in self.lanes),
            used_pages=sum(l.alloc.total_pages - l.alloc.free_pages for l in self.lanes),
            total_pages=sum(l.alloc.total_pages for l in self.lanes),
            used_slots=sum(l.alloc.used_slots for l in self.lanes),
            total_slots=sum(l.alloc.max_running for l in self.lanes),
            integrity_checks=self._integrity_checks,
        )

    def flush_cache(self) -> int:
        return 0  # the lanes keep no prefix cache

    def check_integrity(self) -> None:
        for lane in self.lanes:
            lane.alloc.check_integrity()
        live = {id(r) for lane in self.lanes for r in (*lane.waiting, *lane.running)}
        if live != {id(r) for r in self._reqs.values()}:
            raise AssertionError("coordinator lost track of a request: waiting + running != live requests")
        self._integrity_checks += 1

    def step(self) -> list[RequestOutput]:
        """Raises WorkerFailure when a worker died or failed, after stopping the workers and freeing
        every request: the lock-stepped workers cannot go on without it, so nothing can be served
        (the server turns this into 503s that name the worker)."""
        outputs, self._outbox = self._outbox, []
        try:
            if self.failure is not None:
                raise WorkerFailure(self.failure)
            while len(self._inflight) < self.afd.coordinator_lead and self._send_step():
                pass
            if self._inflight:
                outputs += self._retire(self._inflight.popleft())
            elif dead := self.workers.dead():  # idle: no collective is there to notice a death
                raise WorkerFailure(describe_dead(dead))
            elif any(l.waiting for l in self.lanes) and not any(l.running for l in self.lanes):
                raise RuntimeError("coordinator stalled: nothing running and no waiting request fits")
        except WorkerFailure as e:
            if self.failure is None:
                self._fail(str(e))
            raise
        return outputs

    # -- planning -------------------------------------------------------------------------------
    def _plan_lanes(self) -> list[list[tuple[Request, int]]]:
        """Each lane's (request, tokens) for the next step. Without graph buckets, decodes and
        prefill chunks share a step (plan_batch). With them, every rank must replay the same
        decode-only graph, so a step is all decodes or all prefill chunks. When both are waiting
        the kinds alternate: a decode then waits behind at most one prefill step, which plan_batch
        bounds by the requests present (prefill_budget.py), as it bounds a mixed step."""
        def plan(lane: Lane) -> list[tuple[Request, int]]:
            return plan_batch(lane.running, lane.waiting, lane.alloc, self.max_seq_len, self.chunk_size,
                              self.prefill_budget, self.per_request)

        if not self.graph_buckets:
            return [plan(lane) for lane in self.lanes]
        decodes = [[(r, 1) for r in lane.running if decodable(r, self.max_seq_len)] for lane in self.lanes]
        if not (any(decodes) and self._prefilled_last):
            prefills = [[(r, n) for r, n in plan(lane) if not r.prefill_done] for lane in self.lanes]
            if any(prefills):
                self._prefilled_last = True
                return prefills
        self._prefilled_last = False
        return decodes

    def _send_step(self) -> bool:
        """Plan and send one step to every worker; False when no lane has anything to run."""
        per_lane = self._plan_lanes()
        if not any(per_lane):
            return False
        step = self._step
        self._step += 1
        plans: list[tuple[str, object]] = []
        mbs_per_lane, prefill = [], False
        for lane, items in zip(self.lanes, per_lane):
            new, pages, mbs = [], [], []
            contexts = [r.num_computed + n for r, n in items]  # what each request's full attention reads
            for group in split(items, contexts, self.afd.num_mb, self.afd.mb_split):
                reqs = []
                for r, n in group:
                    wire = self._wire[r.rid]
                    if r.num_computed == 0:
                        new.append(NewRequest(wire, r.slot, r.params))
                    start, fresh = lane.alloc.ensure_tokens(r.slot, r.num_computed + n)
                    if fresh:
                        pages.append(PageAssignment(r.slot, start, tuple(fresh)))
                    tokens = None
                    if not r.prefill_done:
                        tokens = tuple(r.prompt_ids[r.num_computed : r.num_computed + n])
                        prefill = True
                    r.num_computed += n
                    sample = r.num_computed == r.seq_len
                    reqs.append(ReqStep(wire, r.slot, r.num_computed - n, n, tokens, sample))
                    if sample:
                        r.num_pending += 1
                mbs.append(tuple(reqs))
            mbs_per_lane.append((lane, mbs, new, pages))
        largest = max(sum(r.extend_len for r in mb) for _, mbs, _, _ in mbs_per_lane for mb in mbs)
        bucket, use_graph = step_bucket(self.graph_buckets, largest, decode=not prefill)
        self.graph_steps += use_graph
        workers = self.workers
        for (lane, mbs, new, pages), name in zip(mbs_per_lane, workers.ag_names):
            frees, lane.frees = tuple(lane.frees), []
            plan = AgPlan(step, bucket, tuple(mbs), frees, tuple(new), tuple(pages), use_graph)
            plans += [(member, plan) for member in workers.lane_members[name]]
        eg_plan = EgPlan(step, self.afd.num_mb, bucket, "prefill" if prefill else "decode", use_graph)
        plans += [(name, eg_plan) for name in workers.eg_names]
        size = 0
        for name, plan in plans:
            data = pickle.dumps(plan)
            size += len(data)
            workers.send(name, data)
        self.plan_bytes.append(size)
        self._inflight.append(step)
        if not prefill:
            self._decode_steps.add(step)
        return True

    # -- replies --------------------------------------------------------------------------------
    def _retire(self, step: int) -> list[RequestOutput]:
        deadline = time.monotonic() + self.afd.step_timeout_s
        names = self.workers.names  # every worker replies, each lane's TP ranks included
        while len(self._replies.get(step, {})) < len(names):
            msg = self.workers.recv(deadline, f"step {step}", lambda: sorted(set(names) - set(self._replies.get(step, {}))))
            if isinstance(msg, Reply):
                self._replies.setdefault(msg.step, {})[msg.worker] = msg
        touched: dict[int, Request] = {}
        decode = step in self._decode_steps
        self._decode_steps.discard(step)
        for reply in self._replies.pop(step).values():
            if decode:
                self.decode_launch.add(reply.worker, reply.launch_s)
            for wire, tok in reply.tokens:
                r = self._by_wire.get(wire)
                if r is None:  # aborted or finished while this step was in flight
                    continue
                r.num_pending -= 1
                if r.finished:
                    continue
                r.output_ids.append(tok)
                check_finish(r, tok, self.eos, self.max_seq_len)
                touched[id(r)] = r
        return take_outputs(touched.values(), self._release)

    def _release(self, r: Request) -> None:
        lane = self._lane_of[r.rid]
        lane.running.remove(r)
        lane.alloc.free(r.slot)
        lane.frees.append(r.slot)  # travels in the next plan, after every step that still uses it
        r.slot = None
        self._forget(r)

    def _forget(self, r: Request) -> None:
        self._reqs.pop(r.rid, None)
        self._lane_of.pop(r.rid, None)
        self._by_wire.pop(self._wire.pop(r.rid, ""), None)

    def _fail(self, reason: str) -> None:
        """Every request is dropped and its pages freed; the workers are stopped; new requests are refused."""
        logger.error("AFD failure: %s", reason)
        self.failure = reason
        for lane in self.lanes:
            for r in lane.running:
                lane.alloc.free(r.slot)
            lane.waiting.clear()
            lane.running.clear()
            lane.frees.clear()
        self._reqs.clear()
        self._lane_of.clear()
        self._wire.clear()
        self._by_wire.clear()
        self._inflight.clear()
        self.workers.kill()
