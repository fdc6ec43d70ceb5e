"""CUDA graphs of both AFD roles' decode steps, the per-layer exchange inside.

A captured step holds every (layer, micro-batch) dispatch and combine, so every rank must replay a
graph of the same bucket in the same step: the coordinator puts one bucket and one use_graph flag
in every plan of a step (afd/buckets.py). Each rank captures a bucket's graph on the lock-step
warm-up's step of that bucket, which every rank meets in the same order before the coordinator
reports ready (afd/warmup.py holds one per bucket); a worker that fails a capture fails the start,
and a real step of a bucket without a graph is refused. A capture runs the step once eagerly first
(engine/graph.py's capture_graph: Triton compiles, lazily made buffers are allocated); that run's
exchanges meet the peers' capture runs, which is why every rank must decide alike whether it
captures (capture_blocker reads only what every rank shares). The capture itself runs nothing, so
it exchanges nothing.

Only the ipc transport can sit in a graph: its messages are copies into the peer's mapped inbox and
flag kernels, with the flags' counts on the device, so each replay raises and awaits new values
without the host (kernels/device_flags.py). torch.distributed's send/recv (p2p: gloo, NCCL) are
host calls and stay eager, as does the CPU.
"""
from __future__ import annotations

import logging
from typing import Callable, Hashable

import torch

from minisgl.afd.protocol import WorkerSpec
from minisgl.afd.transport_choice import uses_ipc
from minisgl.afd.warmup import wanted
from minisgl.engine.graph import StaticDecodeInputs, capture_graph, check_table_width
from minisgl.engine.plan import EnginePlan
from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import HybridPool
from minisgl.kvcache.pages import _num_pages

logger = logging.getLogger(__name__)


def capture_blocker(spec: WorkerSpec, plan: EnginePlan) -> str | None:
    """Why no worker of this run captures its graph steps (they then run eagerly at the bucket's
    padded shape), or None. Every rank reads the same flags, so every rank gets the same answer:
    a capture's warm-up run exchanges with the peers', so one rank capturing alone would hang."""
    afd = spec.afd_args
    if not afd.graph_buckets:
        return "decode steps are not planned in graph buckets (--afd-graph-buckets)"
    if plan.device.type != "cuda":
        return "the workers run on the CPU"
    if not plan.cuda_graphs:
        return "--disable-cuda-graph"
    if not uses_ipc(spec):
        return "the p2p transport (torch.distributed send/recv) cannot be captured in a CUDA graph; --afd-transport ipc can"
    if afd.attn_tp_size > 1:
        return "lanes over several GPUs (--afd-attn-tp-size > 1) are not captured yet"
    if not wanted(afd.warmup, [spec.device]):
        return "--afd-warmup off: the graphs are captured in the lock-step warm-up"
    if afd.layer_timing_dir:
        return "per-layer timing marks each layer from the host"
    unsafe = plan.backends.build().graph_unsafe()
    if unsafe:
        return f"{', '.join(unsafe)} synchronise with the host in decode"
    return None


def log_capture_choice(name: str, blocker: str | None, buckets: tuple[int, ...]) -> None:
    if blocker is None:
        logger.info("%s: decode steps of buckets %s replay CUDA graphs (captured in lock step)", name, list(buckets))
    elif buckets:
        logger.info("%s: decode graph buckets %s run eagerly at their padded shapes: %s", name, list(buckets), blocker)


class LockstepGraphs:
    """One graph per key, captured in a warm-up step with one eager run before it, all sharing one
    memory pool (a worker replays one step at a time, on one stream)."""

    def __init__(self) -> None:
        self.mempool = torch.cuda.graph_pool_handle()
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}

    def capture(self, key: Hashable, run: Callable[[], None]) -> None:
        if key not in self.graphs:
            self.graphs[key] = capture_graph(run, self.mempool, warm_runs=1)

    def replay(self, key: Hashable) -> None:
        if key not in self.graphs:
            raise ValueError(f"no decode graph was captured for {key} (the lock-step warm-up captures every "
                             f"bucket; captured: {sorted(self.graphs)})")
        self.graphs[key].replay()

    def __len__(self) -> int:
        return len(self.graphs)


class AttentionGraphs:
    """An attention worker's decode step per bucket: embedding through the final norm and lm_head of
    every micro-batch, the exchanges inside (the worker's ping-pong loop, on one stream). Each
    micro-batch reads its own static inputs (engine/graph.py's, padded with the dummy slot and row);
    the logits land in one static buffer, sampled after the replay."""

    def __init__(
        self, forward: Callable[[list[ForwardBatch]], list[torch.Tensor]], pool: HybridPool, max_seq_len: int,
        buckets: tuple[int, ...], num_mb: int, vocab: int,
    ) -> None:
        self.forward, self.pool = forward, pool
        self.table_width = _num_pages(max_seq_len, pool.page_size)
        device = pool.page_table.device
        self.inputs = [StaticDecodeInputs(buckets[-1], pool.dummy_row, pool.page_size, device) for _ in range(num_mb)]
        self.logits = torch.empty(num_mb, buckets[-1], vocab, dtype=torch.float32, device=device)
        self.graphs = LockstepGraphs()

    def __len__(self) -> int:
        return len(self.graphs)

    def capture(self, bucket: int) -> None:
        """Capture the bucket's step (a warm-up step of that bucket, on every rank alike)."""
        if bucket in self.graphs.graphs:
            return
        for inputs in self.inputs:  # the capture's eager run decodes the dummy slot only
            inputs.clear()
        batches = [inputs.batch(bucket) for inputs in self.inputs]

        def run() -> None:
            for mb, logits in enumerate(self.forward(batches)):
                self.logits[mb, :bucket].copy_(logits)

        self.graphs.capture(bucket, run)

    def replay(self, batches: list[ForwardBatch], bucket: int) -> list[torch.Tensor]:
        """The step's logits [bucket, V] per micro-batch, for batches padded to `bucket`. The views
        are overwritten by the next replay: the caller samples them on the stream before it."""
        check_table_width(self.pool.page_table, self.table_width)
        for inputs, batch in zip(self.inputs, batches, strict=True):
            inputs.load(batch, bucket)
        self.graphs.replay(bucket)
        return [self.logits[mb, :bucket] for mb in range(len(self.inputs))]
