"""Group routed (token, slot) pairs by expert, in fixed-size buffers and without a host sync.

Input: local expert ids [T, k] (ids outside [0, E) are skipped: padding, or another worker's experts).
Output, with BLOCK_M the rows per GEMM program:
- `rows` [max_blocks * BLOCK_M] int32: flat pair index t * k + j, grouped by expert; each expert's
  rows start on a BLOCK_M boundary, and the unused tail of its last block holds garbage;
- `block_expert` [max_blocks] int32: the expert of each block, -1 for blocks past the last;
- `block_rows` [max_blocks] int32: how many leading rows of each block are real.

Three phases over the ids: count with atomics (each pair's atomic result is its rank within its
expert), turn counts into block offsets with a cumsum and write the block table (each expert its
own blocks, one pass per block of the busiest expert), then scatter. For decode's few pairs one
program runs all three, separated by barriers (one launch); for prefill's many, phases 1 and 3 run
one program per chunk of pairs, as three launches. Ranks
from atomics order rows within an expert arbitrarily; each row's GEMM result does not depend on
its position, so the output is still deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _count_chunk(ids_ptr, c0, num_ids, num_experts, counts_ptr, rank_ptr, CHUNK: tl.constexpr):
    """Phase 1 over ids [c0, c0 + CHUNK): each valid pair's atomic ticket is its rank in its expert."""
    offs = c0 + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < num_ids, other=-1)
    ok = (ids >= 0) & (ids < num_experts)
    rank = tl.atomic_add(counts_ptr + ids, 1, mask=ok)
    tl.store(rank_ptr + offs, rank, mask=ok)


@triton.jit
def _block_table(counts_ptr, starts_ptr, block_expert_ptr, block_rows_ptr, max_blocks,
                 BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, E_P2: tl.constexpr):
    """Phase 2: each expert's blocks from its count (expert e owns blocks [start_e, end_e)), the
    unused tail marked -1, and each expert's first row into starts."""
    ex = tl.arange(0, E_P2)
    counts = tl.load(counts_ptr + ex)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    end = tl.cumsum(blocks, axis=0)
    start = end - blocks
    for j in range(tl.max(blocks, axis=0)):
        mine = j < blocks
        tl.store(block_expert_ptr + start + j, ex, mask=mine)
        tl.store(block_rows_ptr + start + j, tl.minimum(counts - j * BLOCK_M, BLOCK_M), mask=mine)
    total = tl.sum(blocks, axis=0)
    for b0 in range(total, max_blocks, CHUNK):
        b = b0 + tl.arange(0, CHUNK)
        tl.store(block_expert_ptr + b, tl.full((CHUNK,), -1, tl.int32), mask=b < max_blocks)
        tl.store(block_rows_ptr + b, tl.zeros((CHUNK,), tl.int32), mask=b < max_blocks)
    tl.debug_barrier()  # every thread has read the counts (starts may alias them)
    tl.store(starts_ptr + ex, start * BLOCK_M)


@triton.jit
def _scatter_chunk(ids_ptr, c0, num_ids, num_experts, starts_ptr, rank_ptr, rows_ptr, CHUNK: tl.constexpr):
    """Phase 3 over ids [c0, c0 + CHUNK): each valid pair's index into its expert's rows."""
    offs = c0 + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < num_ids, other=-1)
    ok = (ids >= 0) & (ids < num_experts)
    dest = tl.load(starts_ptr + ids, mask=ok, other=0) + tl.load(rank_ptr + offs, mask=ok, other=0)
    tl.store(rows_ptr + dest, offs, mask=ok)


@triton.jit(do_not_specialize=["num_ids", "max_blocks"])
def _moe_align_kernel(
    ids_ptr, num_ids, num_experts, counts_ptr, rank_ptr, rows_ptr, block_expert_ptr, block_rows_ptr, max_blocks,
    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, E_P2: tl.constexpr,
):
    """All three phases in one program (decode: one launch; global writes of a program are visible
    to all its threads after a barrier). The counts buffer is reused for the starts."""
    tl.store(counts_ptr + tl.arange(0, E_P2), tl.zeros((E_P2,), dtype=tl.int32))
    tl.debug_barrier()
    for c0 in range(0, num_ids, CHUNK):
        _count_chunk(ids_ptr, c0, num_ids, num_experts, counts_ptr, rank_ptr, CHUNK)
    tl.debug_barrier()
    _block_table(counts_ptr, counts_ptr, block_expert_ptr, block_rows_ptr, max_blocks, BLOCK_M, CHUNK, E_P2)
    tl.debug_barrier()
    for c0 in range(0, num_ids, CHUNK):
        _scatter_chunk(ids_ptr, c0, num_ids, num_experts, counts_ptr, rank_ptr, rows_ptr, CHUNK)


@triton.jit(do_not_specialize=["num_ids"])
def _moe_count_kernel(ids_ptr, num_ids, num_experts, counts_ptr, rank_ptr, CHUNK: tl.constexpr):
    _count_chunk(ids_ptr, tl.program_id(0) * CHUNK, num_ids, num_experts, counts_ptr, rank_ptr, CHUNK)


@triton.jit(do_not_specialize=["max_blocks"])
def _moe_block_table_kernel(counts_ptr, starts_ptr, block_expert_ptr, block_rows_ptr, max_blocks,
                            BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, E_P2: tl.constexpr):
    _block_table(counts_ptr, starts_ptr, block_expert_ptr, block_rows_ptr, max_blocks, BLOCK_M, CHUNK, E_P2)


@triton.jit(do_not_specialize=["num_ids"])
def _moe_scatter_kernel(ids_ptr, num_ids, num_experts, starts_ptr, rank_ptr, rows_ptr, CHUNK: tl.constexpr):
    _scatter_chunk(ids_ptr, tl.program_id(0) * CHUNK, num_ids, num_experts, starts_ptr, rank_ptr, rows_ptr, CHUNK)


@dataclass(frozen=True)
class ExpertGrouping:
    """Routed pairs grouped by expert (see the module docstring); all device tensors."""

    rows: torch.Tensor
    block_expert: torch.Tensor
    block_rows: torch.Tensor
    block_m: int
    top_k: int

    @property
    def max_blocks(self) -> int:
        return self.block_expert.shape[0]


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """An upper bound on sum_e ceil(count_e / block_m): every block holds >= 1 pair, and at most one
    partial block per expert."""
    return max(1, min(num_pairs, triton.cdiv(num_pairs, block_m) + num_experts))


CHUNK = 1024  # pairs per phase-1/3 pass (and per program in the split launch)
ONE_PROGRAM_PAIRS = 4 * CHUNK  # up to here one program does all (decode); above, three launches


def align_experts(local_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertGrouping:
    """The grouping with `block_m` rows per block (moe_gemm.regime picks it from the pair count)."""
    t, k = local_ids.shape
    num_pairs = t * k
    nb = max_blocks(num_pairs, num_experts, block_m)
    dev = local_ids.device
    ids = local_ids.contiguous()
    e_p2 = triton.next_power_of_2(num_experts)
    rank = torch.empty(max(num_pairs, 1), dtype=torch.int32, device=dev)
    rows = torch.empty(nb * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(nb, dtype=torch.int32, device=dev)
    block_rows = torch.empty(nb, dtype=torch.int32, device=dev)
    if num_pairs <= ONE_PROGRAM_PAIRS:
        counts = torch.empty(e_p2, dtype=torch.int32, device=dev)
        _moe_align_kernel[(1,)](
            ids, num_pairs, num_experts, counts, rank, rows, block_expert, block_rows, nb,
            BLOCK_M=block_m, CHUNK=CHUNK, E_P2=e_p2, num_warps=8,
        )
    else:  # one program would walk the pairs serially (539 us at 16K tokens x top-8)
        counts = torch.zeros(e_p2, dtype=torch.int32, device=dev)
        chunks = triton.cdiv(num_pairs, CHUNK)
        _moe_count_kernel[(chunks,)](ids, num_pairs, num_experts, counts, rank, CHUNK=CHUNK, num_warps=4)
        _moe_block_table_kernel[(1,)](counts, counts, block_expert, block_rows, nb,
                                      BLOCK_M=block_m, CHUNK=CHUNK, E_P2=e_p2, num_warps=8)
        _moe_scatter_kernel[(chunks,)](ids, num_pairs, num_experts, counts, rank, rows, CHUNK=CHUNK, num_warps=4)
    return ExpertGrouping(rows, block_expert, block_rows, block_m, k)
