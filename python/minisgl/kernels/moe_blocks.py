"""What both orientations of the grouped expert GEMMs share (kernels/moe_gemm.py for decode,
kernels/moe_gemm_large.py for prefill): the tile table's entry, and a program's view of its block
of grouped rows and of its expert's weight rows."""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl


@dataclass(frozen=True)
class MoeTile:
    block_n: int  # weight rows per program (gate_up: of gate, and as many of up)
    num_warps: int
    num_stages: int
    # The large-M kernels (moe_gemm_large.py): tokens on the MMA's wide side, acc [BLOCK_M, BLOCK_N],
    # programs visited in groups of group_m row blocks. Otherwise the decode kernels (acc [BLOCK_N, BLOCK_M]).
    large_m: bool = False
    group_m: int = 8


@triton.jit
def block_rows(grouping_rows_ptr, block_expert_ptr, block_rows_ptr, pid_b, BLOCK_M: tl.constexpr):
    """(expert, positions of this block's rows in grouped order, which of them are real, pair ids)."""
    expert = tl.load(block_expert_ptr + pid_b)
    pos = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    real = tl.arange(0, BLOCK_M) < tl.load(block_rows_ptr + pid_b)
    pair = tl.load(grouping_rows_ptr + pos, mask=real, other=0)
    return expert, pos, real, pair


@triton.jit
def expert_tiles(w_ptr, s_ptr, expert, pid_n, stride_we, stride_wn, stride_se, stride_sn, N,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Weight tile pid_n of `expert`: (its first K step's [BLOCK_N, BLOCK_K] pointers, its rows'
    block-scale pointers, the first row's block-scale pointer, the rows, which rows exist)."""
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    e = expert.to(tl.int64)
    w_ptrs = w_ptr + e * stride_we + rn[:, None].to(tl.int64) * stride_wn + tl.arange(0, BLOCK_K)[None, :]
    s_ptrs = s_ptr + e * stride_se + (rn // BLOCK_K) * stride_sn
    s_first = s_ptr + e * stride_se + (pid_n * BLOCK_N // BLOCK_K) * stride_sn
    return w_ptrs, s_ptrs, s_first, rn, rn < N
