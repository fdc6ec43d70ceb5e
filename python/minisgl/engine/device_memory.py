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

import contextlib
import gc
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from minisgl import prefill_groups
from minisgl.engine import compile_watch
from minisgl.engine.args import DEFAULT_MEM_FRACTION
from minisgl.engine.plan import EnginePlan
from minisgl.engine.warmup import (
    StepShape,
    decode_shapes,
    largest_prefill,
    mixed_shapes,
    most_requests,
    prefill_shapes,
    run_shape,
    scratch_sample,
    size_ladder,
)
from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig, PoolLayout
from minisgl.kvcache.planner import GIB, MAX_AUTO_RUNNING, MemoryBudget, PoolCosts, PoolPlan, plan_pool
from minisgl.parallel.collectives import max_over_ranks
from minisgl.parallel.config import ParallelConfig

Run = Callable[[list[StepShape]], None]
MakeBatch = Callable[[list[list[int]], list[int], list[int]], ForwardBatch]


def peak_bytes(run: Callable[[], None], segments: bool = False) -> int:
    """Bytes allocated at the peak of `run` beyond what was allocated before it. With `segments`, at
    least what the caching allocator's segments grew by from an empty cache: that counts the
    fragmentation the run's mix of tensor sizes leaves, which allocated bytes do not. (The 122B's
    mixed warm-up step on the real pool once failed to find 772 MiB with 1.14 GiB reserved but
    split into smaller free blocks, when the reserve held only the allocated peak.)"""
    torch.cuda.synchronize()
    if segments:
        torch.cuda.empty_cache()
    base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    allocated = torch.cuda.max_memory_allocated() - base
    return max(allocated, torch.cuda.max_memory_reserved() - base_reserved) if segments else allocated


def _per_row(run: Run, rows: int, table_len: int) -> int:
    """Activation bytes each decode row adds to a step `run` makes, from steps of 1 and `rows` rows."""
    one = peak_bytes(lambda: run(decode_shapes([1], table_len)))
    return max(0, peak_bytes(lambda: run(decode_shapes([rows], table_len))) - one) // max(1, rows - 1)


def _runner(plan: EnginePlan, make_batch: MakeBatch, forward: Callable[[ForwardBatch], torch.Tensor],
            sampled: bool = True) -> Run:
    """Runs steps of the given shapes; `sampled`: each step's logits go through the sampler too."""
    config, device = plan.config, plan.device
    generator = torch.Generator(device=device).manual_seed(0)

    def sample(logits: torch.Tensor) -> None:
        if sampled:
            scratch_sample(logits, config.vocab_size, config.eos_token_ids, generator)

    def run(shapes: list[StepShape]) -> None:
        with torch.inference_mode():
            for shape in shapes:
                run_shape(shape, make_batch, forward, sample, config.vocab_size)

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
    gdn_group_tokens: int | None  # the bound on a GDN prefill group's tokens this engine runs with (None: default)
    expandable_segments: bool  # whether the allocator reserved the steps' memory in expandable segments
    final_seconds: float = 0.0
    final_compiles: int = 0
    final_peak_bytes: int = 0

    @property
    def warmup_compiles(self) -> int:
        return self.probe_compiles + self.final_compiles

    @property
    def warmup_seconds(self) -> float:
        return self.probe_seconds + self.final_seconds

    def warm_up_final(
        self, plan: EnginePlan, rows: int, max_len: int, graph_top: int, make_batch: MakeBatch,
        forward: Callable[[ForwardBatch], torch.Tensor],
    ) -> None:
        """Step 3, on the real pool (`rows` slots, `max_len` tokens, decode graphs up to `graph_top`
        rows): what the scratch pool could not show (decodes beside a chunk, and beside the most
        prompt tokens a step may take with them, at the planned number of rows; decode sizes the
        graphs do not cover) and the largest prefill step again; the scratch pool's table was as
        wide, so the other shapes compile nothing new."""
        started, compiles = time.monotonic(), compile_watch.compile_count()
        chunk = plan.args.chunked_prefill_size
        # Beside decodes a step may take the whole prefill budget too (prefill_budget.py), as far as
        # a chunk for each slot goes.
        beside = min(self.max_prefill_tokens, rows * max(1, min(chunk, max_len - 1)))
        shapes = ([largest_prefill(self.max_prefill_tokens, chunk, max_len)]
                  + mixed_shapes(rows, chunk, max_len, beside)
                  + decode_shapes([b for b in size_ladder(rows) if b > graph_top], max_len))
        run = _runner(plan, make_batch, forward)
        self.final_peak_bytes = peak_bytes(lambda: run(shapes))
        self.final_seconds = time.monotonic() - started
        self.final_compiles = compile_watch.compile_count() - compiles

    def describe(self, startup_seconds: float) -> str:
        """The planner's log line."""
        p, g = self.plan, GIB
        groups = self.gdn_group_tokens or prefill_groups.GROUP_TOKENS
        return (
            f"memory: weights {self.weights_bytes / g:.1f} GiB, KV {p.kv_bytes / g:.2f} GiB ({p.num_pages} pages"
            f"{f' of {self.pool_config.kv_dtype}' if self.pool_config.kv_dtype else ''}), "
            f"state {p.state_bytes / g:.2f} GiB ({p.max_running_requests} slots + {p.cache_slots} for the prefix cache), "
            f"activation reserve "
            f"{(self.budget.step_reserve + p.row_reserve_bytes) / g:.2f} GiB (largest step "
            f"{self.budget.step_reserve / g:.2f} GiB + {self.costs.row_bytes / 2**20:.1f} MiB per running request), "
            f"{self.budget.free / g:.1f} GiB free before the pool x {self.budget.fraction}; max concurrency "
            f"{p.max_concurrency(p.max_seq_len, self.costs.page_size)} at {p.max_seq_len} tokens"
            + "".join(f"; {n}" for n in p.notes)
            + f"; GDN prefill groups of up to {groups} tokens"
            + f"; allocator {'with' if self.expandable_segments else 'without'} expandable segments"
            + f". Warm-up: {self.warmup_compiles} Triton compiles/autotunes in {self.warmup_seconds:.1f} s "
            f"({self.probe_seconds:.1f} s measuring, {self.final_compiles} compiles on the real pool) "
            f"(largest step on the real pool {self.final_peak_bytes / g:.2f} GiB); ready {startup_seconds:.1f} s after start"
        )


def prepare_on_device(
    plan: EnginePlan, model: nn.Module, layout: PoolLayout, parallel: ParallelConfig, max_prefill_tokens: int,
    expandable_segments: bool,
) -> DevicePreparation:
    """Steps 1 and 2: warm up `model` (this rank's, storing `layout`) on a scratch pool, measure, plan.
    `expandable_segments`: whether the allocator uses them (engine/allocator_settings.py)."""
    args, flags, device = plan.args, plan.pool, plan.device
    started, compiles = time.monotonic(), compile_watch.compile_count()
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    table_len = flags.max_seq_len
    scratch = HybridPool.scratch(layout, table_len, flags, plan.dtype, device)

    group_tokens: int | None = None  # the GDN group bound of the steps measured (None: the default)

    def make_batch(tokens: list[list[int]], prefix: list[int], slots: list[int]) -> ForwardBatch:
        return ForwardBatch.build(tokens, prefix, slots, scratch.page_table, flags.page_size, device, group_tokens)

    run = _runner(plan, make_batch, lambda b: model(b, scratch))
    most_rows = args.max_running_requests or MAX_AUTO_RUNNING
    step_peak = peak_bytes(lambda: run(prefill_shapes(max_prefill_tokens, args.chunked_prefill_size, table_len)))
    # The largest step once more from an empty cache, for the segments it takes with fragmentation
    # (the whole ladder from empty would count every size's cached segments, as no step holds them).
    largest = largest_prefill(max_prefill_tokens, args.chunked_prefill_size, table_len)
    step_peak = max(step_peak, peak_bytes(lambda: run([largest]), segments=True))

    @contextlib.contextmanager
    def groups_of(bound: int):  # noqa: ANN202 - a context manager
        nonlocal group_tokens
        group_tokens = bound
        try:
            yield
        finally:
            group_tokens = None

    def wide_peak(bound: int) -> int:
        """The peak of the steps whose GDN groups grow most with `bound`: the most tokens, and the
        most requests (each gathers and scatters its state) that many tokens can come in."""
        with groups_of(bound):
            return max(peak_bytes(lambda: run([shape]), segments=True)
                       for shape in {largest, most_requests(max_prefill_tokens, table_len)})

    gdn_groups, step_peak = _gdn_group_tokens(wide_peak, step_peak, max_prefill_tokens,
                                              torch.cuda.mem_get_info()[1] - weights, parallel, device)
    # A running request's decode row costs activations in eager mixed steps (the model and the
    # sampler), and with decode graphs once more: the graphs' private pool holds the model's
    # activations at the largest bucket (the sampler runs outside the graphs), and the graphs copy
    # their fp32 logits into one static buffer of that many rows (engine/graph.py).
    forward_only = _runner(plan, make_batch, lambda b: model(b, scratch), sampled=False)
    row_bytes = _per_row(run, most_rows, table_len)
    if plan.cuda_graphs:
        row_bytes += _per_row(forward_only, most_rows, table_len) + plan.config.vocab_size * 4
    del scratch, run, forward_only
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    # Each TP rank measured its own device; rank 0's allocator is mirrored on the others, so all
    # plan one pool, from the tightest rank's figures. (layout is this rank's share.)
    neg_free, step_peak, row_bytes = max_over_ranks([-free, step_peak, row_bytes], parallel, device)
    free = -neg_free
    budget = MemoryBudget(free, step_peak, args.mem_fraction_static or DEFAULT_MEM_FRACTION)
    costs = PoolCosts.of(layout, flags, plan.dtype, row_bytes)
    pool_plan = plan_pool(costs, budget.usable, plan.config.max_position_embeddings, args.context_length,
                          args.max_running_requests, args.mamba_full_memory_ratio, flags.prefix_cache,
                          args.max_mamba_cache_size)
    return DevicePreparation(weights, budget, costs, pool_plan, pool_plan.config(flags), time.monotonic() - started,
                             compile_watch.compile_count() - compiles, max_prefill_tokens, gdn_groups,
                             expandable_segments)


# GDN groups of a whole step (prefill_groups.py) give fla's recurrence several sequences' heads to
# spread over the SMs: 3-5% of a 16K-token prefill step on the H200 (docs/benchmarks.md, 2026-12-04),
# for ~0.1 MiB a token more activations at 122B shapes. Taken when the largest step's peak grows by
# at most this share of the memory the weights leave (the 35B's ~0.7 of 105 GiB), not where the pool
# would lose requests to it (the 122B's ~1.4 of 24 GiB: about 7 of its 8K requests).
WIDE_GROUP_SHARE = 0.02


def wide_groups_pay(growth: int, room: int) -> bool:
    """Whether the largest step's peak growing by `growth` bytes under whole-step GDN groups is worth
    it, with `room` bytes of the device left by the weights."""
    return growth <= WIDE_GROUP_SHARE * room


def _gdn_group_tokens(wide_peak: Callable[[int], int], narrow_peak: int, max_prefill_tokens: int, room: int,
                      parallel: ParallelConfig, device: torch.device) -> tuple[int | None, int]:
    """(the GDN group bound this engine runs with, None for the default; the largest steps' peak
    under it): groups of up to max_prefill_tokens tokens, kept if they pay. Every TP rank measures
    and all decide on the tightest rank's figures, so they group alike."""
    if max_prefill_tokens <= prefill_groups.GROUP_TOKENS:
        return None, narrow_peak
    peak = wide_peak(max_prefill_tokens)
    growth, neg_room = max_over_ranks([peak - narrow_peak, -room], parallel, device)
    if wide_groups_pay(growth, -neg_room):
        return max_prefill_tokens, max(narrow_peak, peak)
    return None, narrow_peak
