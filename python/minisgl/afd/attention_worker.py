"""An attention worker: one data-parallel lane. It owns its requests' KV pages and state slots,
embeddings, attention/GDN, norms, router, shared expert, lm_head and sampling; the routed experts
are reached through RemoteMoE. The model is the same definition a colocated engine runs.

A lane may span --afd-attn-tp-size ranks, sharded as a colocated TP engine is. Every rank gets the
lane's plan and applies it to its own pool; TP rank 0 samples, replies with the tokens and talks
to the expert workers; the other ranks get each micro-batch's input ids from it by broadcast."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from minisgl.afd.buckets import check_graph_bucket, decode_graph_buckets
from minisgl.afd.expert_plan import ExpertPlan
from minisgl.afd.layer_timing import StepMarks, make_timer
from minisgl.afd.protocol import AgPlan, Reply, ReqStep, WarmupStep, WorkerSpec
from minisgl.afd.remote_moe import InFlight, RemoteMoE, StepState
from minisgl.afd.step_graphs import AttentionGraphs, capture_blocker, log_capture_choice
from minisgl.afd.transport_choice import make_transport
from minisgl.engine.async_sample import AsyncSample, request_generator, sample_async
from minisgl.engine.engine import Engine
from minisgl.engine.sampler import Sampler
from minisgl.engine.warmup import StepShape, scratch_sample, shape_batch
from minisgl.forward_batch import ForwardBatch
from minisgl.host_copy import to_device
from minisgl.kvcache.allocator import DUMMY_PAGE, DUMMY_SLOT
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig
from minisgl.models.weights import WeightFilter
from minisgl.parallel.collectives import broadcast_from_leader
from minisgl.parallel.config import SINGLE, ParallelConfig


@dataclass
class Launched:
    step: int
    rids: list[str]
    sample: AsyncSample
    marks: StepMarks | None = None


def _padded(shape: StepShape, rows: int) -> StepShape:
    """Padded to `rows` requests with decodes at position 0, as _batch pads a graph step's micro-batch."""
    pad = rows - len(shape.extend)
    return StepShape(shape.extend + (1,) * pad, shape.prefix + (0,) * pad)


class AttentionWorker:
    def __init__(self, spec: WorkerSpec, lane: ParallelConfig = SINGLE) -> None:
        self.name = spec.name
        self.lane = lane
        # The colocated engine's decode graphs stay off here: a step's graph holds the per-layer
        # exchange, so every rank captures the same buckets in lock step (afd/step_graphs.py).
        plan = spec.engine_plan.on_device(spec.device)
        self.graph_buckets = decode_graph_buckets(plan, spec.afd_args)
        blocker = capture_blocker(spec, plan)
        log_capture_choice(self.name, blocker, self.graph_buckets)
        plan = replace(plan, cuda_graphs=False)
        config, device = plan.config, plan.device
        self.device = device
        ExpertPlan(config.num_experts, spec.afd_args.expert_workers)  # validates E % N
        self.transport = make_transport(spec, config.hidden_size, config.top_k, plan.dtype, device, lane.tp_size)
        self.step_state = StepState()
        dispatcher = self.transport if lane.is_leader else None  # one exchange per lane

        def remote(layer_id: int) -> RemoteMoE:
            return RemoteMoE(
                config.hidden_size, config.num_experts, config.top_k, config.shared_expert_intermediate_size,
                config.norm_topk_prob, dispatcher, self.step_state, lane,
            )

        # With probe steps the pool is planned after them (afd/pool_probe.py); they run on a scratch pool.
        pool_later = bool(spec.probe_steps)
        self.engine = Engine(plan, WeightFilter.attention_worker(), mlp_factory=remote, warm_up=False, parallel=lane,
                             pool_later=pool_later)
        self.model = self.engine.model
        self.lane_generator = torch.Generator(device=device).manual_seed(plan.args.seed + spec.index)
        self.timer = make_timer(
            spec.afd_args.layer_timing_dir, self.name, device, role="attn", layer_types=list(config.layer_types),
            attn_workers=spec.afd_args.attn_workers, expert_workers=spec.afd_args.expert_workers,
        )
        self.num_mb = spec.afd_args.num_mb
        self.captures = blocker is None and bool(self.graph_buckets)  # decode graphs will hold a pool of their own
        self.graphs: AttentionGraphs | None = None
        self._can_capture = blocker is None
        if not pool_later:
            self._pool_ready()

    def allocate_pool(self, cfg: PoolConfig) -> None:
        """The planned pool in place of the scratch one the probe steps ran on."""
        self.engine.allocate_pool(cfg)
        self._pool_ready()

    def _pool_ready(self) -> None:
        """What is sized by the pool: the device-side tokens, the per-slot sampler, the decode graphs."""
        config, device = self.engine.config, self.device
        # Each slot's newest sampled token stays on the device: the next decode embeds it directly.
        self.last_token = torch.zeros(self.pool.max_running + 1, dtype=torch.int64, device=device)
        self.sampler = Sampler(config.vocab_size, device, config.eos_token_ids, self.pool.max_running)  # by slot
        self.graphs = None if not self._can_capture else AttentionGraphs(
            self._forward, self.pool, self.engine.max_seq_len, self.graph_buckets, self.num_mb, config.vocab_size,
        )

    @property
    def pool(self) -> HybridPool:
        """The engine's: the scratch one until allocate_pool, then the planned one."""
        return self.engine.pool

    # -- pool updates ---------------------------------------------------------------------------
    def _apply(self, plan: AgPlan) -> None:
        for slot in plan.free_slots:
            self.pool.clear_slot(slot)
            self.sampler.remove(slot)
        for new in plan.new_requests:
            self.pool.reset_slot(new.slot)
            self.sampler.add(new.slot, new.params, request_generator(new.params, self.lane_generator))
        for a in plan.pages:
            self.pool.assign_pages(a.slot, a.start, list(a.pages))

    def _batch(self, reqs: tuple[ReqStep, ...], rows: int) -> ForwardBatch:
        """The micro-batch padded to `rows` requests with decodes of the dummy slot at position 0,
        whose table row points at the dummy page: a decode graph's static inputs are padded so."""
        pad = rows - len(reqs)
        tokens = [list(r.tokens) if r.tokens is not None else [0] for r in reqs] + [[0]] * pad
        batch = self.engine.make_batch(tokens, [r.prefix_len for r in reqs] + [0] * pad,
                                       [r.slot for r in reqs] + [DUMMY_SLOT] * pad)
        decodes = [i for i, r in enumerate(reqs) if r.tokens is None]
        if decodes and self.lane.is_leader:
            slots = to_device([reqs[i].slot for i in decodes], torch.int64, self.last_token.device)
            batch.input_ids[batch.logit_idx[decodes]] = self.last_token[slots]
        broadcast_from_leader(batch.input_ids, self.lane)  # the decode tokens exist on rank 0 only
        return batch

    # -- the forward ----------------------------------------------------------------------------
    def _forward(self, batches: list[ForwardBatch | None], marks: StepMarks | None = None) -> list[torch.Tensor | None]:
        """Micro-batch ping-pong: while the experts run micro-batch i of layer l, this worker
        computes micro-batch i+1 of layer l. Empty micro-batches still join every exchange.
        With marks (layer timing on), one micro-batch also takes this loop, which marks each layer."""
        if len(batches) == 1 and batches[0] is not None and marks is None:
            return [self.model(batches[0], self.pool)]
        hidden = self.model.config.hidden_size
        empty = torch.empty(0, hidden, dtype=self.engine.dtype, device=self.device)
        xs, ctxs, resid = {}, {}, {}
        for mb, b in enumerate(batches):
            if b is not None:
                xs[mb], ctxs[mb] = self.model.embed(b, self.pool)
        if marks is not None:
            marks.mark(-1, -1, "embedded")
        inflight: dict[int, InFlight] = {}
        for l, layer in enumerate(self.model.layers):
            for mb, b in enumerate(batches):
                if mb in inflight:
                    xs[mb] = resid[mb] + layer.mlp.combine(inflight.pop(mb))
                if marks is not None:
                    marks.mark(l, mb, "combined")
                if b is None:
                    resid[mb], y = empty, empty
                else:
                    resid[mb], y = layer.mixer_half(xs[mb], ctxs[mb])
                inflight[mb] = layer.mlp.dispatch(y, mb)
                if marks is not None:
                    marks.mark(l, mb, "dispatched")
        out: list[torch.Tensor | None] = []
        for mb, b in enumerate(batches):
            x = resid[mb] + layer.mlp.combine(inflight.pop(mb))
            if marks is not None:
                marks.mark(len(self.model.layers), mb, "combined")
            out.append(None if b is None else self.model.logits(x, b))
            if marks is not None:
                marks.mark(len(self.model.layers), mb, "logits")
        return out

    def _run(self, batches: list[ForwardBatch | None], use_graph: bool, bucket: int,
             marks: StepMarks | None = None) -> list[torch.Tensor | None]:
        """A graph step (every micro-batch padded to the bucket) replays its bucket's graph where
        this run captures; every other step runs eagerly."""
        if use_graph and self.graphs is not None:
            return self.graphs.replay(batches, bucket)
        return self._forward(batches, marks)

    @property
    def captured_graphs(self) -> int:
        return 0 if self.graphs is None else len(self.graphs)

    @torch.inference_mode()
    def launch(self, plan: AgPlan) -> Launched:
        check_graph_bucket(plan.step, plan.bucket, plan.use_graph, self.graph_buckets)
        self._apply(plan)
        self.step_state.bucket = plan.bucket
        marks = None
        if self.timer is not None:
            marks = self.timer.start(
                plan.step, decode=all(r.tokens is None for mb in plan.micro_batches for r in mb),
                mb_tokens=[sum(r.extend_len for r in mb) for mb in plan.micro_batches],
                contexts=[[r.prefix_len + r.extend_len for r in mb] for mb in plan.micro_batches],
            )
        for r in (r for mb in plan.micro_batches for r in mb if r.tokens is not None):
            self.sampler.see_prompt(r.slot, r.tokens)
        if plan.use_graph:  # every micro-batch takes the bucket's shape, an idle one all padding
            batches = [self._batch(mb, plan.bucket) for mb in plan.micro_batches]
        else:
            batches = [self._batch(mb, len(mb)) if mb else None for mb in plan.micro_batches]
        logits = self._run(batches, plan.use_graph, plan.bucket, marks)
        rows, rids, slots = [], [], []
        for mb, reqs in enumerate(plan.micro_batches):
            for i, r in enumerate(reqs):
                if r.sample and self.lane.is_leader:  # the lane's TP rank 0 samples and replies
                    rows.append(logits[mb][i])
                    rids.append(r.rid)
                    slots.append(r.slot)
        device = self.last_token.device
        stacked = torch.stack(rows) if rows else torch.empty(0, self.sampler.vocab_size, device=device)
        sample = sample_async(self.sampler, stacked, slots)  # with no rows, still the step's end event
        if rows:
            self.last_token[to_device(slots, torch.int64, device)] = sample.tokens
        if marks is not None:
            marks.mark(-1, -1, "end")
        return Launched(plan.step, rids, sample, marks)

    @torch.inference_mode()
    def warm_up(self, step: WarmupStep) -> None:
        """A step of the given shape on the dummy slot and page, as engine/warmup.py runs one, through
        the same exchange as a real step; its logits go through a scratch sampler (both sampling
        branches, with the logit adjustments), so no request's sampler, slot or page is touched."""
        check_graph_bucket(step.step, step.bucket, step.use_graph, self.graph_buckets)
        self.step_state.bucket = step.bucket
        vocab = self.engine.config.vocab_size
        shapes = [_padded(s, step.bucket) if step.use_graph else s for s in step.micro_batches]
        batches = [shape_batch(s, self.engine.make_batch, vocab) if s.extend else None for s in shapes]
        if step.use_graph and self.graphs is not None:  # every rank captures the bucket at this step
            self.graphs.capture(step.bucket)
        logits = self._run(batches, step.use_graph, step.bucket)
        rows = [x for x in logits if x is not None]
        if rows and self.lane.is_leader:
            scratch_sample(torch.cat(rows), vocab, self.engine.config.eos_token_ids,
                           torch.Generator(device=self.device).manual_seed(0))
        self.transport.check()
        if step.last:  # the steps wrote only the dummy slot and page: no table row holds a page
            self.pool.check_integrity()
            if bool((self.pool.page_table != DUMMY_PAGE).any()):
                raise AssertionError("the warm-up left a page in the page table")

    def retire(self, launched: Launched) -> Reply:
        tokens = launched.sample.wait()
        self.transport.check()
        if launched.marks is not None:
            self.timer.write(launched.marks)
        return Reply(launched.step, self.name, tuple(zip(launched.rids, tokens)))
