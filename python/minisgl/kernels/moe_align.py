"""Group routed (token, slot) pairs by expert, in fixed-size buffers and one launch (no host sync).

Input: local expert ids [T, k] (ids outside [0, E) are skipped: padding, or another worker's experts).
Output, with BLOCK_M the rows per GEMM program:
- `rows` [max_blocks * BLOCK_M] int32: flat pair index t * k + j, grouped by expert; each expert's
  rows start on a BLOCK_M boundary, and the unused tail of its last block holds garbage;
- `block_expert` [max_blocks] int32: the expert of each block, -1 for blocks past the last;
- `block_rows` [max_blocks] int32: how many leading rows of each block are real.

One program does it all in three phases over the ids, separated by barriers (global writes of a
program are visible to all its threads after one): count with atomics (each pair's atomic result
is its rank within its expert), turn counts into block offsets with a cumsum and write the block
table (each expert its own blocks, one pass per block of the busiest expert), then scatter. Ranks
from atomics order rows within an expert arbitrarily; each row's GEMM result does not depend on
its position, so the output is still deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _moe_align_kernel(
    ids_ptr, num_ids, num_experts, counts_ptr, rank_ptr, rows_ptr, block_expert_ptr, block_rows_ptr, max_blocks,
    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, E_P2: tl.constexpr,
):
    ex = tl.arange(0, E_P2)
    tl.store(counts_ptr + ex, tl.zeros((E_P2,), dtype=tl.int32))
    tl.debug_barrier()
    for c0 in range(0, num_ids, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_ids, other=-1)
        ok = (ids >= 0) & (ids < num_experts)
        rank = tl.atomic_add(counts_ptr + ids, 1, mask=ok)
        tl.store(rank_ptr + offs, rank, mask=ok)
    tl.debug_barrier()
    counts = tl.load(counts_ptr + ex)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    end = tl.cumsum(blocks, axis=0)
    start = end - blocks
    for j in range(tl.max(blocks, axis=0)):  # expert e owns blocks [start_e, end_e)
        mine = j < blocks
        tl.store(block_expert_ptr + start + j, ex, mask=mine)
        tl.store(block_rows_ptr + start + j, tl.minimum(counts - j * BLOCK_M, BLOCK_M), mask=mine)
    total = tl.sum(blocks, axis=0)
    for b0 in range(total, max_blocks, CHUNK):  # the unused tail
        b = b0 + tl.arange(0, CHUNK)
        tl.store(block_expert_ptr + b, tl.full((CHUNK,), -1, tl.int32), mask=b < max_blocks)
        tl.store(block_rows_ptr + b, tl.zeros((CHUNK,), tl.int32), mask=b < max_blocks)
    tl.debug_barrier()  # every thread has read the counts before they are overwritten with row starts
    tl.store(counts_ptr + ex, start * BLOCK_M)
    tl.debug_barrier()
    for c0 in range(0, num_ids, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_ids, other=-1)
        ok = (ids >= 0) & (ids < num_experts)
        dest = tl.load(counts_ptr + ids, mask=ok, other=0) + tl.load(rank_ptr + offs, mask=ok, other=0)
        tl.store(rows_ptr + dest, offs, mask=ok)


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


def rows_per_block(num_pairs: int, num_experts: int) -> int:
    """BLOCK_M from the mean pairs per expert: 16 (the tensor cores' minimum) for decode, up to 64."""
    return min(64, max(16, triton.next_power_of_2(triton.cdiv(num_pairs, num_experts))))


def align_experts(local_ids: torch.Tensor, num_experts: int, block_m: int | None = None) -> ExpertGrouping:
    t, k = local_ids.shape
    num_pairs = t * k
    block_m = block_m or rows_per_block(num_pairs, num_experts)
    nb = max_blocks(num_pairs, num_experts, block_m)
    dev = local_ids.device
    e_p2 = triton.next_power_of_2(num_experts)
    counts = torch.empty(e_p2, dtype=torch.int32, device=dev)
    rank = torch.empty(max(num_pairs, 1), dtype=torch.int32, device=dev)
    rows = torch.empty(nb * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(nb, dtype=torch.int32, device=dev)
    block_rows = torch.empty(nb, dtype=torch.int32, device=dev)
    _moe_align_kernel[(1,)](
        local_ids.contiguous(), num_pairs, num_experts, counts, rank, rows, block_expert, block_rows, nb,
        BLOCK_M=block_m, CHUNK=1024, E_P2=e_p2, num_warps=8,
    )
    return ExpertGrouping(rows, block_expert, block_rows, block_m, k)
