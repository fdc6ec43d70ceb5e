"""Group routed (token, slot) pairs by expert, in fixed-size buffers and without a host sync.

Input: local expert ids [T, k] (ids outside [0, E) are skipped: padding, or another worker's experts).
Output, with BLOCK_M the rows per GEMM program:
- `rows` [max_blocks * BLOCK_M] int32: flat pair index t * k + j, grouped by expert; each expert's
  rows start on a BLOCK_M boundary, and the unused tail of its last block holds garbage;
- `block_expert` [max_blocks] int32: the expert of each block, -1 for blocks past the last;
- `block_rows` [max_blocks] int32: how many leading rows of each block are real.

Decode's few pairs (up to ONE_PROGRAM_PAIRS) take one program, one launch, in three phases separated
by barriers: count with atomics (each pair's atomic result is its rank within its expert), turn
counts into block offsets with a cumsum and write the block table (each expert its own blocks, one
pass per block of the busiest expert), then scatter. Ranks from atomics order rows within an expert
arbitrarily; each row's GEMM result does not depend on its position, so the output is still
deterministic.

Prefill's many pairs take three launches and no atomics (on the few counters of skewed routing's hot
experts, atomics serialize: 65-110 us at 16K tokens x top-8 on an H200):
1. one program per chunk of CHUNK pairs sorts its keys expert * CHUNK + offset in registers (invalid
   ids as expert E, last) and stores them, with its count of each expert (a histogram);
2. one program sums the counts over chunks, writes the block table (each block finds its expert by a
   binary search over the experts' block ends, so skew costs nothing), and gives each (chunk, expert)
   the row where that chunk's pairs of that expert go, less their first sorted position;
3. one program per chunk places its sorted keys: a pair's row is that base plus its sorted position.
There each expert's rows hold its pairs in increasing pair index.
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


@triton.jit
def _split_tables(work_ptr, num_chunks, CHUNK: tl.constexpr, E_P2: tl.constexpr):
    """The split path's workspace: each chunk's sorted keys [num_chunks, CHUNK] at work_ptr, then its
    count of each expert and its rows' base for each expert ([num_chunks, E_P2] each)."""
    counts_ptr = work_ptr + num_chunks * CHUNK
    return counts_ptr, counts_ptr + num_chunks * E_P2


@triton.jit(do_not_specialize=["num_ids"])
def _moe_sort_kernel(ids_ptr, num_ids, num_experts, work_ptr, CHUNK: tl.constexpr, E_P2: tl.constexpr):
    """Phase 1 over chunk c: its keys expert * CHUNK + offset sorted (the order of the rows it will
    give), and its count of each expert."""
    c = tl.program_id(0)
    counts_ptr, _ = _split_tables(work_ptr, tl.num_programs(0), CHUNK, E_P2)
    offs = tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + c * CHUNK + offs, mask=c * CHUNK + offs < num_ids, other=-1)
    ok = (ids >= 0) & (ids < num_experts)
    expert = tl.where(ok, ids, num_experts).to(tl.int32)  # checked before the cast: no id wraps into range
    tl.store(counts_ptr + c * E_P2 + tl.arange(0, E_P2), tl.histogram(expert, E_P2, mask=ok))
    tl.store(work_ptr + c * CHUNK + offs, tl.sort(expert * CHUNK + offs))


@triton.constexpr_function
def _log2(n: int) -> int:
    return n.bit_length() - 1


@triton.jit
def _search_block_table(counts, block_expert_ptr, block_rows_ptr, max_blocks,
                        BLOCK_M: tl.constexpr, E_P2: tl.constexpr, TILE_B: tl.constexpr):
    """Phase 2's block table (the same as _block_table's), TILE_B blocks at a time: block b's expert
    is the number of experts whose blocks end at or before b. Returns each expert's first row."""
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    end = tl.cumsum(blocks, axis=0)
    total = tl.sum(blocks, axis=0)
    start = (end - blocks) * BLOCK_M
    for b0 in range(0, max_blocks, TILE_B):
        b = b0 + tl.arange(0, TILE_B)
        expert = tl.zeros((TILE_B,), tl.int32)
        for i in tl.static_range(1, _log2(E_P2) + 1):  # binary search, steps E_P2/2 .. 1: exact for b < total
            step = E_P2 >> i
            expert += tl.where(tl.gather(end, expert + step - 1, 0) <= b, step, 0)
        rows = tl.minimum(tl.gather(start + counts, expert, 0) - b * BLOCK_M, BLOCK_M)  # to its expert's last row
        tl.store(block_expert_ptr + b, tl.where(b < total, expert, -1), mask=b < max_blocks)
        tl.store(block_rows_ptr + b, tl.where(b < total, rows, 0), mask=b < max_blocks)
    return start


@triton.jit(do_not_specialize=["num_chunks", "max_blocks"])
def _moe_bases_kernel(work_ptr, num_chunks, block_expert_ptr, block_rows_ptr, max_blocks, BLOCK_M: tl.constexpr,
                      CHUNK: tl.constexpr, E_P2: tl.constexpr, TILE_C: tl.constexpr, TILE_B: tl.constexpr):
    """Phase 2: the block table from the total counts, then per (chunk c, expert e) the base
    first_row[e] + (e's pairs in chunks before c) - (c's pairs of experts before e), walking the
    counts TILE_C chunks at a time."""
    counts_ptr, bases_ptr = _split_tables(work_ptr, num_chunks, CHUNK, E_P2)
    tile = tl.arange(0, TILE_C)[:, None] * E_P2 + tl.arange(0, E_P2)[None, :]
    totals = tl.zeros((E_P2,), tl.int32)
    for c0 in range(0, num_chunks, TILE_C):
        mine = (c0 + tl.arange(0, TILE_C) < num_chunks)[:, None]
        totals += tl.sum(tl.load(counts_ptr + c0 * E_P2 + tile, mask=mine, other=0), axis=0)
    carry = _search_block_table(totals, block_expert_ptr, block_rows_ptr, max_blocks, BLOCK_M, E_P2, TILE_B)
    for c0 in range(0, num_chunks, TILE_C):
        mine = (c0 + tl.arange(0, TILE_C) < num_chunks)[:, None]
        n = tl.load(counts_ptr + c0 * E_P2 + tile, mask=mine, other=0)
        # the exclusive cumsums over chunks and over experts: each inclusive one less n, which cancels
        base = carry[None, :] + tl.cumsum(n, axis=0) - tl.cumsum(n, axis=1)
        tl.store(bases_ptr + c0 * E_P2 + tile, base, mask=mine)
        carry += tl.sum(n, axis=0)


@triton.jit
def _moe_place_kernel(work_ptr, num_experts, rows_ptr, CHUNK: tl.constexpr, E_P2: tl.constexpr):
    """Phase 3 over chunk c: the pair at sorted position p goes to row base[c, expert] + p (the rows
    of one expert are consecutive: the stores coalesce)."""
    c = tl.program_id(0)
    _, bases_ptr = _split_tables(work_ptr, tl.num_programs(0), CHUNK, E_P2)
    p = tl.arange(0, CHUNK)
    keys = tl.load(work_ptr + c * CHUNK + p)
    expert = keys // CHUNK
    ok = expert < num_experts
    dest = tl.load(bases_ptr + c * E_P2 + expert, mask=ok, other=0) + p
    tl.store(rows_ptr + dest, c * CHUNK + keys % CHUNK, mask=ok)


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


CHUNK = 1024  # pairs per pass of the one program; pairs per program (and sort) in the split launches
ONE_PROGRAM_PAIRS = 4 * CHUNK  # up to here one program does all (decode); above, three launches
TILE_ELEMS = 4096  # counts per tile of phase 2's walk over the [chunks, E_P2] table (16 a thread)
TILE_B = 1024  # blocks per pass of phase 2's block table


def align_experts(local_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertGrouping:
    """The grouping with `block_m` rows per block (moe_gemm.regime picks it from the pair count)."""
    t, k = local_ids.shape
    num_pairs = t * k
    nb = max_blocks(num_pairs, num_experts, block_m)
    dev = local_ids.device
    ids = local_ids.contiguous()
    e_p2 = triton.next_power_of_2(num_experts)
    rows = torch.empty(nb * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(nb, dtype=torch.int32, device=dev)
    block_rows = torch.empty(nb, dtype=torch.int32, device=dev)
    if num_pairs <= ONE_PROGRAM_PAIRS:
        counts = torch.empty(e_p2, dtype=torch.int32, device=dev)
        rank = torch.empty(max(num_pairs, 1), dtype=torch.int32, device=dev)
        _moe_align_kernel[(1,)](
            ids, num_pairs, num_experts, counts, rank, rows, block_expert, block_rows, nb,
            BLOCK_M=block_m, CHUNK=CHUNK, E_P2=e_p2, num_warps=8,
        )
    else:  # one program would walk the pairs serially (539 us at 16K tokens x top-8)
        chunks = triton.cdiv(num_pairs, CHUNK)
        work = torch.empty(chunks * (CHUNK + 2 * e_p2), dtype=torch.int32, device=dev)  # see _split_tables
        _moe_sort_kernel[(chunks,)](ids, num_pairs, num_experts, work, CHUNK=CHUNK, E_P2=e_p2, num_warps=4)
        _moe_bases_kernel[(1,)](work, chunks, block_expert, block_rows, nb, BLOCK_M=block_m, CHUNK=CHUNK,
                                E_P2=e_p2, TILE_C=max(1, TILE_ELEMS // e_p2), TILE_B=TILE_B, num_warps=8)
        _moe_place_kernel[(chunks,)](work, num_experts, rows, CHUNK=CHUNK, E_P2=e_p2, num_warps=4)
    return ExpertGrouping(rows, block_expert, block_rows, block_m, k)
