"""Preparing the engine on a GPU before it serves: measure, plan the pool, warm up.

1. On a scratch pool (one slot, the table width of the real one), run every warm-up shape
   (engine/warmup.py): Triton compiles and autotunes now, and the largest prefill step's peak
   activations are measured; decode steps of one row and of the most rows measure what each
   running request adds to a step (logits, sampling, and the same again in the decode graphs' pool).
2. Give what is free, less that reserve, times --mem-fraction-static, to the pool
   (kvcache/planner.py). Under TP every rank measures its own device and prices its own share of
   a slot and a page; the ranks then plan from the tightest rank's figures, so their pools match.
3. With the real pool and its decode graphs, run the shapes again: what still compiles counts as
   warm-up; from then on every compile is logged as a stall.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from minisgl.engine import compile_watch
from minisgl.engine.args import DEFAULT_MEM_FRACTION
from minisgl.engine.sampler import Sampler
from minisgl.engine.warmup import (
    StepShape,
    decode_shapes,
    largest_prefill,
    mixed_shapes,
    prefill_shapes,
    run_shape,
    size_ladder,
)
from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig
from minisgl.kvcache.planner import GIB, MAX_AUTO_RUNNING, MemoryBudget, PoolCosts, PoolPlan, plan_pool
from minisgl.parallel.collectives import max_over_ranks
from minisgl.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minisgl.engine.engine import Engine

Run = Callable[[list[StepShape]], None]


def _peak(run: Callable[[], None]) -> int:
    """Bytes allocated at the peak of `run` beyond what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _runner(engine: "Engine", make_batch: Callable[..., ForwardBatch], forward: Callable[[ForwardBatch], torch.Tensor]) -> Run:
    generator = torch.Generator(device=engine.device).manual_seed(0)

    def sample(logits: torch.Tensor, params: list[SamplingParams]) -> None:
        sampler = Sampler(engine.config.vocab_size, engine.device, engine.config.eos_token_ids, len(params))
        for key, p in enumerate(params):
            sampler.add(key, p, None if p.greedy else generator)
        sampler.sample(logits, list(range(len(params))))

    def run(shapes: list[StepShape]) -> None:
        with torch.inference_mode():
            for shape in shapes:
                run_shape(shape, make_batch, forward, sample, engine.config.vocab_size)

    return run


@dataclass
class DevicePreparation:
    weights_bytes: int
    budget: MemoryBudget
    costs: PoolCosts
    plan: PoolPlan
    pool_config: PoolConfig
    probe_seconds: float
    probe_compiles: int
    max_prefill_tokens: int
    final_seconds: float = 0.0
    final_compiles: int = 0
    final_peak_bytes: int = 0

    @property
    def warmup_compiles(self) -> int:
        return self.probe_compiles + self.final_compiles

    @property
    def warmup_seconds(self) -> float:
        return self.probe_seconds + self.final_seconds

    def warm_up_final(self, engine: "Engine") -> None:
        """Step 3, on the real pool: what the scratch pool could not show (decodes beside a chunk at
        the planned number of rows, decode sizes the graphs do not cover) and the largest prefill
        step again; the scratch pool's table was as wide, so the other shapes compile nothing new."""
        started, compiles = time.monotonic(), compile_watch.compile_count()
        rows, chunk, max_len = engine.pool.max_running, engine.args.chunked_prefill_size, engine.max_seq_len
        graph_top = engine.graph_runner.buckets[-1] if engine.graph_runner is not None else 0
        shapes = ([largest_prefill(self.max_prefill_tokens, chunk, max_len)] + mixed_shapes(rows, chunk, max_len)
                  + decode_shapes([b for b in size_ladder(rows) if b > graph_top], max_len))
        run = _runner(engine, engine.make_batch, engine.forward_batch)
        self.final_peak_bytes = _peak(lambda: run(shapes))
        self.final_seconds = time.monotonic() - started
        self.final_compiles = compile_watch.compile_count() - compiles

    def describe(self, startup_seconds: float) -> str:
        """The planner's log line."""
        p, g = self.plan, GIB
        return (
            f"memory: weights {self.weights_bytes / g:.1f} GiB, KV {p.kv_bytes / g:.2f} GiB ({p.num_pages} pages), "
            f"state {p.state_bytes / g:.2f} GiB ({p.max_running_requests} slots), activation reserve "
            f"{(self.budget.step_reserve + p.row_reserve_bytes) / g:.2f} GiB (largest step "
            f"{self.budget.step_reserve / g:.2f} GiB + {self.costs.row_bytes / 2**20:.1f} MiB per running request), "
            f"{self.budget.free / g:.1f} GiB free before the pool x {self.budget.fraction}; max concurrency "
            f"{p.max_concurrency(p.max_seq_len, self.costs.page_size)} at {p.max_seq_len} tokens"
            + "".join(f"; {n}" for n in p.notes)
            + f". Warm-up: {self.warmup_compiles} Triton compiles/autotunes in {self.warmup_seconds:.1f} s "
            f"({self.probe_seconds:.1f} s measuring, {self.final_compiles} compiles on the real pool) "
            f"(largest step on the real pool {self.final_peak_bytes / g:.2f} GiB); ready {startup_seconds:.1f} s after start"
        )


def prepare_on_device(engine: "Engine", max_prefill_tokens: int) -> DevicePreparation:
    """Steps 1 and 2: warm up on a scratch pool, measure, plan."""
    args, config = engine.args, engine.config
    started, compiles = time.monotonic(), compile_watch.compile_count()
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    ssm_name = args.mamba_ssm_dtype or config.mamba_ssm_dtype
    ssm_dtype = getattr(torch, ssm_name)
    table_len = args.context_length or config.max_position_embeddings
    scratch = HybridPool.scratch(engine.layout, table_len, args.page_size, engine.dtype, ssm_name, engine.device)

    def make_batch(tokens: list[list[int]], prefix: list[int], slots: list[int]) -> ForwardBatch:
        return ForwardBatch.build(tokens, prefix, slots, scratch.page_table, args.page_size, engine.device)

    run = _runner(engine, make_batch, lambda b: engine.model(b, scratch))
    most_rows = args.max_running_requests or MAX_AUTO_RUNNING
    step_peak = _peak(lambda: run(prefill_shapes(max_prefill_tokens, args.chunked_prefill_size, table_len)))
    one_row = _peak(lambda: run(decode_shapes([1], table_len)))
    all_rows = _peak(lambda: run(decode_shapes([most_rows], table_len)))
    # A running request's decode row costs its activations twice: in eager mixed steps, and once
    # more in the decode graphs' private pool, captured for the largest bucket.
    row_bytes = 2 * max(0, all_rows - one_row) // max(1, most_rows - 1)
    del scratch, run
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    # Each TP rank measured its own device; rank 0's allocator is mirrored on the others, so all
    # plan one pool, from the tightest rank's figures. (engine.layout is this rank's share.)
    neg_free, step_peak, row_bytes = max_over_ranks([-free, step_peak, row_bytes], engine.parallel, engine.device)
    free = -neg_free
    budget = MemoryBudget(free, step_peak, args.mem_fraction_static or DEFAULT_MEM_FRACTION)
    costs = PoolCosts(
        slot_bytes=engine.layout.state_bytes_per_slot(engine.dtype, ssm_dtype),
        row_bytes=row_bytes,
        page_bytes=engine.layout.kv_bytes_per_page(args.page_size, engine.dtype),
        page_size=args.page_size,
    )
    plan = plan_pool(costs, budget.usable, config.max_position_embeddings, args.context_length,
                     args.max_running_requests)
    pool_cfg = PoolConfig(plan.max_running_requests, plan.max_seq_len, args.page_size, plan.num_pages, ssm_name)
    return DevicePreparation(weights, budget, costs, plan, pool_cfg, time.monotonic() - started,
                             compile_watch.compile_count() - compiles, max_prefill_tokens)
