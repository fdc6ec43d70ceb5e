"""CUDA-graph decode: one captured graph per batch bucket, replayed with static input buffers.

The captured page table is the pool's own table, whose width is _num_pages(max_seq_len,
page_size): the same helper every other user of the table calls. A replay against a wider table
raises instead of silently reading a narrowed one. A batch smaller than its bucket is padded with
the dummy state slot (0) and the dummy table row, whose pages all point at the dummy page 0.
"""
from __future__ import annotations

import bisect
from typing import Callable

import torch

from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.allocator import DUMMY_PAGE, DUMMY_SLOT
from minisgl.kvcache.hybrid_pool import HybridPool
from minisgl.kvcache.pages import _num_pages


def decode_buckets(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to max_bs (and max_bs itself)."""
    if max_bs < 1:
        raise ValueError(f"cuda_graph_max_bs must be >= 1, got {max_bs}")
    small = [b for b in (1, 2, 4) if b < max_bs]
    return small + list(range(8, max_bs, 8)) + [max_bs]


def check_table_width(page_table: torch.Tensor, captured_width: int) -> None:
    if page_table.shape[1] > captured_width:
        raise ValueError(
            f"page table has {page_table.shape[1]} columns but the decode graphs were captured for "
            f"{captured_width}: replaying would silently drop pages; recapture for the larger max_seq_len"
        )


class StaticDecodeInputs:
    """The static buffers a captured decode graph reads, sized for the largest bucket. Padding rows
    use position 0 of the dummy row (every page the dummy page 0) and the dummy state slot 0, so
    their K/V and state writes land in scratch space no request owns."""

    def __init__(self, size: int, dummy_row: int, page_size: int, device: torch.device) -> None:
        i64 = dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(size, **i64)
        self.positions = torch.zeros(size, **i64)
        self.slots = torch.zeros(size, **i64)
        self.table_rows = torch.full((size,), dummy_row, **i64)
        self.cache_loc = torch.zeros(size, **i64)
        self.seq_lens = torch.ones(size, dtype=torch.int32, device=device)
        self.cu_seqlens = torch.arange(size + 1, dtype=torch.int32, device=device)
        self.logit_idx = torch.arange(size, **i64)
        self._fields = (
            (self.input_ids, "input_ids", 0),
            (self.positions, "positions", 0),
            (self.slots, "slots", DUMMY_SLOT),
            (self.table_rows, "table_rows", dummy_row),
            (self.seq_lens, "seq_lens", 1),
            (self.cache_loc, "cache_loc", DUMMY_PAGE * page_size),
        )

    def batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:bs], positions=self.positions[:bs], cu_seqlens=self.cu_seqlens[: bs + 1],
            seq_lens=self.seq_lens[:bs], slots=self.slots[:bs], table_rows=self.table_rows[:bs],
            cache_loc=self.cache_loc[:bs], logit_idx=self.logit_idx[:bs],
            prefix_lens=(0,) * bs, extend_lens=(1,) * bs,
        )

    def clear(self) -> None:
        """Every row padding: what a capture's eager warm-up run reads, so it writes no request's state."""
        for buf, _, pad in self._fields:
            buf.fill_(pad)

    def load(self, batch: ForwardBatch, bucket: int) -> None:
        """Copy a decode batch in and pad it to `bucket` rows."""
        if not batch.is_decode:
            raise ValueError("only decode batches (one new token per request) replay a decode graph")
        bs = batch.batch_size
        for buf, name, pad in self._fields:
            buf[:bs].copy_(getattr(batch, name), non_blocking=True)
            buf[bs:bucket].fill_(pad)


def capture_graph(run: Callable[[], None], mempool: tuple, warm_runs: int) -> torch.cuda.CUDAGraph:
    """Capture `run` (which writes its results into static buffers) after `warm_runs` eager runs on
    a side stream, so Triton compiles and autotunes, and lazily made buffers are allocated, outside
    the capture. The graphs sharing `mempool` must never run concurrently."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warm_runs):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=mempool):
        run()
    return graph


class DecodeGraphRunner:
    """Captures model(batch, pool) for decode batches of each bucket size; replays with copies into
    static buffers. Needs backends that read only device tensors in decode (no host syncs)."""

    def __init__(self, model: torch.nn.Module, pool: HybridPool, max_seq_len: int, max_bs: int) -> None:
        self.model, self.pool = model, pool
        self.buckets = decode_buckets(min(max_bs, pool.max_running))
        self.table_width = _num_pages(max_seq_len, pool.page_size)
        if pool.page_table.shape[1] != self.table_width:
            raise ValueError(f"pool table width {pool.page_table.shape[1]} != _num_pages(max_seq_len) {self.table_width}")
        self.inputs = StaticDecodeInputs(self.buckets[-1], pool.dummy_row, pool.page_size, pool.page_table.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # Every graph copies its logits into this one buffer (made before the first capture, outside
        # the graphs' pool): a graph's own output tensor would stay allocated in the pool, one
        # [bucket, vocab] fp32 per bucket, 15 GiB over the 67 buckets up to 512 rows at a 248K vocabulary.
        self.logits: torch.Tensor | None = None
        self.mempool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):  # largest first, so smaller graphs reuse its memory
            self._capture(bs)

    @torch.inference_mode()
    def _capture(self, bs: int) -> None:
        batch = self.inputs.batch(bs)

        def run() -> None:
            out = self.model(batch, self.pool)
            if self.logits is None:  # the largest bucket is captured first, its warm-up run first of all
                self.logits = torch.empty_like(out)
            self.logits[:bs].copy_(out)

        self.graphs[bs] = capture_graph(run, self.mempool, warm_runs=2)

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.is_decode and batch.batch_size <= self.buckets[-1]

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        check_table_width(self.pool.page_table, self.table_width)
        bucket = self.buckets[bisect.bisect_left(self.buckets, batch.batch_size)]
        self.inputs.load(batch, bucket)
        self.graphs[bucket].replay()
        return self.logits[: batch.batch_size]
