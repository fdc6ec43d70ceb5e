"""An expert worker: holds experts [r·E/N, (r+1)·E/N) of every layer and, each step, runs every
(layer, micro-batch) exchange: receive all attention workers' rows, compute, return partial sums.
The next receive is posted before computing, so the transfer overlaps the expert GEMMs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.afd.buckets import check_graph_bucket, decode_graph_buckets
from minisgl.afd.expert_plan import ExpertPlan
from minisgl.afd.layer_timing import StepMarks, make_timer
from minisgl.afd.expert_stage import ExpertShard
from minisgl.afd.protocol import EgPlan, Reply, WarmupStep, WorkerSpec
from minisgl.afd.step_graphs import LockstepGraphs, capture_blocker, log_capture_choice
from minisgl.afd.transport_choice import make_transport
from minisgl.models.dummy_weights import init_dummy_weights
from minisgl.models.materialize import build_module
from minisgl.models.weights import WeightFilter, load_weights


@dataclass
class Launched:
    step: int
    done: torch.cuda.Event | None
    marks: StepMarks | None = None


class ExpertWorker:
    def __init__(self, spec: WorkerSpec) -> None:
        self.name = spec.name
        plan = spec.engine_plan.on_device(spec.device)
        config, device, dtype = plan.config, plan.device, plan.dtype
        start, end = ExpertPlan(config.num_experts, spec.afd_args.expert_workers).owned(spec.index)
        backend = plan.backends.build_one("moe")
        self.shard = build_module(lambda: ExpertShard(config, start, end - start, backend), dtype, device, plan.fp8)
        if plan.args.load_format == "dummy":  # the colocated engine's values for these experts
            init_dummy_weights(self.shard, plan.args.seed)
        else:
            load_weights(self.shard, plan.model_path, config, WeightFilter.expert_worker(start, end))
        self.num_layers = config.num_layers
        self.transport = make_transport(spec, config.hidden_size, config.top_k, dtype, device,
                                        spec.afd_args.attn_tp_size)
        self.device = device
        self.graph_buckets = decode_graph_buckets(plan, spec.afd_args)
        blocker = capture_blocker(spec, plan)
        log_capture_choice(self.name, blocker, self.graph_buckets)
        self.graphs = None if blocker is not None else LockstepGraphs()
        self.captures = self.graphs is not None and bool(self.graph_buckets)  # decode graphs will hold a pool
        self.timer = make_timer(
            spec.afd_args.layer_timing_dir, self.name, device, role="expert",
            attn_workers=spec.afd_args.attn_workers, expert_workers=spec.afd_args.expert_workers,
        )

    @property
    def captured_graphs(self) -> int:
        return 0 if self.graphs is None else len(self.graphs)

    @torch.inference_mode()
    def launch(self, plan: EgPlan) -> Launched:
        marks = None if self.timer is None else self.timer.start(plan.step, decode=plan.phase == "decode")
        self._exchange(plan, marks)
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return Launched(plan.step, done, marks)

    @torch.inference_mode()
    def warm_up(self, step: WarmupStep) -> None:
        """The step's exchanges, as for a real step of its shape (routing travels with the data); a
        graph step's graph is captured first, as every rank captures the bucket at this step."""
        if step.use_graph and self.graphs is not None:
            self.graphs.capture((step.bucket, step.num_mb), lambda: self._layers(step.bucket, step.num_mb, None))
        self._exchange(EgPlan(step.step, step.num_mb, step.bucket, step.phase, step.use_graph), None)
        self.transport.check()

    def _exchange(self, plan: EgPlan, marks: StepMarks | None) -> None:
        """A graph step replays the graph of (bucket, num_mb) captured in the warm-up; every other
        step runs eagerly."""
        check_graph_bucket(plan.step, plan.bucket, plan.use_graph, self.graph_buckets)
        if plan.use_graph and self.graphs is not None:
            self.graphs.replay((plan.bucket, plan.num_mb))
        else:
            self._layers(plan.bucket, plan.num_mb, marks)

    def _layers(self, bucket: int, num_mb: int, marks: StepMarks | None) -> None:
        """Every (layer, micro-batch) exchange of a step: receive, compute, send. Every message has
        the bucket's M x bucket rows, padding included (rows routed to expert -1 compute nothing; a
        graph step's padding rows are the attention workers' dummy decodes, whose partial sums they
        drop), so the shapes are static and a graph holds the whole step."""
        order = [(layer, mb) for layer in range(self.num_layers) for mb in range(num_mb)]
        sends: dict[int, list] = {}
        nxt = self.transport.post_receive(0, bucket)
        for i, (layer, mb) in enumerate(order):
            hidden, ids, weights = self.transport.receive(nxt)
            if i + 1 < len(order):
                nxt = self.transport.post_receive(order[i + 1][1], bucket)
            if marks is not None:
                marks.mark(layer, mb, "received")
            out = self.shard.stage(layer)(hidden, ids, weights)
            if marks is not None:
                marks.mark(layer, mb, "computed")
            for w in sends.pop(mb, []):  # this micro-batch's send buffer is about to be reused
                w.wait()
            sends[mb] = self.transport.send_combine(mb, bucket, out)
            if marks is not None:
                marks.mark(layer, mb, "sent")
        for works in sends.values():
            for w in works:
                w.wait()
        if marks is not None:
            marks.mark(-1, -1, "end")

    def retire(self, launched: Launched) -> Reply:
        if launched.done is not None:
            launched.done.synchronize()
        self.transport.check()
        if launched.marks is not None:
            self.timer.write(launched.marks)
        return Reply(launched.step, self.name)
