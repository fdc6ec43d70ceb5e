"""Piecewise CUDA graphs for prefill and mixed steps.

An eager step of the 122B model launches ~1,300 Triton kernels and ~500 GEMMs from Python, so up
to a few thousand tokens the host, not the GPU, sets a step's time (docs/benchmarks.md). Only the
mixers' cores (ForwardContext.mixer_core: attention over the pages, the conv and the delta rule
over the state slots) read per-request metadata; everything else in a step depends on the token
count alone. So, per token bucket, a step is captured as one CUDA graph per stretch between cores
(the embedding to the first core, core to core, the last core to the final hidden state), and a
replay runs graph, core, graph, ... with the cores eager on the step's real requests.

Padding: a step of n tokens replays the smallest bucket T >= n. Rows n..T of the static inputs hold
token 0 at position 0, and rows past n of a core's output keep what an earlier step left there
(zeros at first): finite values, and every op outside the cores works row by row, so padded rows
never reach a real one. The cores see rows [:n] only.

Static buffers: a core's inputs are copied, inside the graph before it, into buffers shared by
every core of the same signature, and a replayed core writes its output into another (its `out`);
nothing else crosses from a graph to the next. (Keeping each layer's own projections alive instead would hold
~5 GiB at 4K tokens.) All graphs share one memory pool: they run one after another, and graphs of
different buckets never interleave.

`capture=False` runs the same data flow without graphs (every stretch eagerly on the static
buffers each time): the CPU tests check padding and the cores' slicing that way.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Callable

import torch

from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import HybridPool
from minisgl.layers.row_pieces import assembled
from minisgl.models.context import ForwardContext
from minisgl.models.qwen3_5_moe import Qwen3_5MoeForCausalLM

MakeBatch = Callable[[int], ForwardBatch]  # a prefill batch of that many tokens on the capture pool
SMALLEST = 16


def piecewise_buckets(top: int, chunk: int) -> list[int]:
    """Token counts captured, up to `top`: 16 to 256 by doubling, then steps of at most a quarter
    (rounded up to 64 tokens: padding wastes at most ~25%), every power of two (prompt lengths
    often are), and a chunk plus 64-512 decode rows, the shape of every step while prompts arrive
    under load."""
    if top < 1:
        raise ValueError(f"piecewise CUDA graphs need a top bucket >= 1 token, got {top}")
    sizes = {top}
    n = SMALLEST
    while n < top:
        sizes.add(n)
        n = 2 * n if n < 256 else -(-(n + n // 4) // 64) * 64
    sizes.update(1 << p for p in range(top.bit_length()) if SMALLEST <= 1 << p <= top)
    sizes.update(chunk + rows for rows in (64, 128, 256, 512) if chunk + rows <= top)
    return sorted(sizes)


class CoreBuffers:
    """The static buffers between graphs and cores: one per (role, argument, row shape, dtype),
    `rows` rows long (the top bucket), zeroed when made."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._buffers: dict[tuple[object, ...], torch.Tensor] = {}

    def get(self, role: str, index: int, like: torch.Tensor) -> torch.Tensor:
        key = (role, index, tuple(like.shape[1:]), like.dtype)
        if key not in self._buffers:
            self._buffers[key] = torch.zeros(self.rows, *like.shape[1:], dtype=like.dtype, device=like.device)
        return self._buffers[key]

    def zero(self) -> None:
        for buf in self._buffers.values():
            buf.zero_()


@dataclass(frozen=True)
class CoreCall:
    """One core of a captured step: the function and its static inputs and output (bucket rows)."""

    fn: Callable[..., torch.Tensor]
    inputs: tuple[torch.Tensor, ...]
    output: torch.Tensor

    def run(self, ctx: ForwardContext, n: int) -> None:
        # The core writes its rows into the static output itself: no copy after it.
        self.fn(ctx, *(t[:n] for t in self.inputs), out=self.output[:n])


@dataclass
class Piece:
    """One bucket: its graphs (one more than its cores), the cores between them, the final hidden
    state, and the rotary tables the first graph writes (for the cores' context)."""

    graphs: list[torch.cuda.CUDAGraph]
    cores: list[CoreCall]
    hidden: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    static_batch: ForwardBatch | None = None  # capture=False: the capture's batch, which the stretches see

    def context(self, batch: ForwardBatch, pool: HybridPool) -> ForwardContext:
        return ForwardContext(batch, pool, self.cos, self.sin)


class _Capture:
    """The core runner while a bucket is captured: ends the running graph at each core (after the
    copies into the static inputs), runs the core eagerly, and begins the next graph. With
    capture=False it only records the cores (and makes the static buffers, outside any graph's
    pool): the eager run before a capture, and the whole of an uncaptured runner's preparation."""

    def __init__(self, buffers: CoreBuffers, rows: int, mempool: tuple[int, int] | None, capture: bool) -> None:
        self.buffers, self.rows, self.mempool, self.capture = buffers, rows, mempool, capture
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.cores: list[CoreCall] = []
        self.rotary: tuple[torch.Tensor, torch.Tensor] | None = None

    def begin(self) -> None:
        if self.capture:
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=self.mempool)
            self.graphs.append(graph)

    def end(self) -> None:
        if self.capture:
            self.graphs[-1].capture_end()

    def __call__(self, fn: Callable[..., torch.Tensor], ctx: ForwardContext, *tensors: torch.Tensor) -> torch.Tensor:
        self.rotary = (ctx.cos, ctx.sin)
        inputs = tuple(self.buffers.get("in", i, t)[: self.rows].copy_(t) for i, t in enumerate(tensors))
        self.end()
        out = assembled(fn(ctx, *inputs))
        static = self.buffers.get("out", 0, out)[: self.rows]
        static.copy_(out)
        self.cores.append(CoreCall(fn, inputs, static))
        self.begin()
        return static


class _Replay:
    """The core runner of an uncaptured replay (capture=False): the stretches run eagerly on the
    static buffers, the cores exactly as a graph replay runs them."""

    def __init__(self, piece: Piece, ctx: ForwardContext, n: int) -> None:
        self.calls, self.ctx, self.n = iter(piece.cores), ctx, n

    def __call__(self, fn: Callable[..., torch.Tensor], ctx: ForwardContext, *tensors: torch.Tensor) -> torch.Tensor:
        call = next(self.calls)
        for static, t in zip(call.inputs, tensors):
            static.copy_(t)
        call.run(self.ctx, self.n)
        return call.output


class PiecewiseGraphRunner:
    """Captures model.hidden for prefill and mixed steps of each bucket on a capture pool (any pool
    of the same layout: the graphs never touch it, only the cores do, and they get the serving
    pool at replay); replays with the step's tokens copied into static buffers."""

    def __init__(self, model: Qwen3_5MoeForCausalLM, capture_pool: HybridPool, make_batch: MakeBatch,
                 buckets: list[int], capture: bool = True) -> None:
        self.model, self.buckets, self.capture = model, buckets, capture
        top = buckets[-1]
        device = capture_pool.page_table.device
        self.input_ids = torch.zeros(top, dtype=torch.int64, device=device)
        self.positions = torch.zeros(top, dtype=torch.int64, device=device)
        self.buffers = CoreBuffers(top)
        self.pieces: dict[int, Piece] = {}
        self.mempool = torch.cuda.graph_pool_handle() if capture else None
        self.stream = torch.cuda.Stream() if capture else None
        with torch.inference_mode():
            for bucket in reversed(buckets):  # largest first, so smaller buckets reuse its memory
                self._capture(bucket, capture_pool, make_batch(bucket))
            self.buffers.zero()  # the captures' cores ran on garbage: pad rows start at zero

    def _capture(self, bucket: int, pool: HybridPool, batch: ForwardBatch) -> None:
        if batch.num_tokens != bucket:
            raise ValueError(f"capture batch has {batch.num_tokens} tokens for bucket {bucket}")
        self.input_ids[:bucket].copy_(batch.input_ids)
        self.positions[:bucket].copy_(batch.positions)
        batch = replace(batch, input_ids=self.input_ids[:bucket], positions=self.positions[:bucket])
        # An eager run first: Triton compiles and autotunes outside the capture, and the static
        # buffers are made outside the graphs' pool.
        recorder = _Capture(self.buffers, bucket, None, capture=False)
        if not self.capture:
            self.model.hidden(batch, pool, recorder)
            self.pieces[bucket] = Piece([], recorder.cores, torch.empty(0), *recorder.rotary, static_batch=batch)
            return
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            self.model.hidden(batch, pool, recorder)
            capture = _Capture(self.buffers, bucket, self.mempool, capture=True)
            capture.begin()
            hidden = self.model.hidden(batch, pool, capture)
            capture.end()
        main.wait_stream(self.stream)
        self.pieces[bucket] = Piece(capture.graphs, capture.cores, hidden, *capture.rotary)

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.num_tokens <= self.buckets[-1]

    def bucket(self, num_tokens: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, num_tokens)]

    @torch.inference_mode()
    def replay(self, batch: ForwardBatch, pool: HybridPool, rows: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits, as model(batch, pool, rows) would return them."""
        n = batch.num_tokens
        bucket = self.bucket(n)
        piece = self.pieces[bucket]
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.input_ids[n:bucket].zero_()
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.positions[n:bucket].zero_()
        ctx = piece.context(batch, pool)
        if not self.capture:
            hidden = self.model.hidden(piece.static_batch, pool, _Replay(piece, ctx, n))
            return self.model.logits(hidden[:n], batch, rows)
        for i, graph in enumerate(piece.graphs):
            graph.replay()
            if i < len(piece.cores):
                piece.cores[i].run(ctx, n)
        return self.model.logits(piece.hidden[:n], batch, rows)
