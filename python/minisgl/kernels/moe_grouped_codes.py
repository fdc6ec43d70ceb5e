"""x's FP8 codes and scales moved into the grouped order that a contiguous grouped GEMM reads
(DeepGEMM's M-grouped layout: each expert's rows in whole BLOCK_M-row blocks, each row naming its
expert, -1 on padding rows), from moe_align's grouping, in two launches and without a host sync:

1. one program per block: each row's expert (-1 past the block's real rows), and the inverse of the
   grouping, `pair_rows[t * k + j]`, the row where pair (t, j) went;
2. one program per token: its codes and scales read once and stored to each of its pairs' rows.

Torch's `index_select` by row reads a token's row once per pair (k times) and writes the padding
rows too; here each token's row is read once and the padding rows are left unwritten. A grouped
GEMM's rows are independent, so what the padding rows hold reaches only their own outputs, which no
reader takes (the combine reads real rows through pair_rows).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernels.moe_align import ExpertGrouping


@triton.jit
def _row_table_kernel(rows_ptr, block_expert_ptr, block_rows_ptr, row_expert_ptr, pair_rows_ptr,
                      BLOCK_M: tl.constexpr):
    b = tl.program_id(0)
    r = b * BLOCK_M + tl.arange(0, BLOCK_M)
    real = tl.arange(0, BLOCK_M) < tl.load(block_rows_ptr + b)
    tl.store(row_expert_ptr + r, tl.where(real, tl.load(block_expert_ptr + b), -1))
    pair = tl.load(rows_ptr + r, mask=real, other=0)
    tl.store(pair_rows_ptr + pair, r, mask=real)


@triton.jit(do_not_specialize=["rows_out", "stride_c", "stride_s", "stride_sg"])
def _scatter_codes_kernel(
    codes_ptr, scales_ptr, pair_rows_ptr, out_ptr, out_scales_ptr, rows_out, stride_c, stride_s, stride_sg,
    WORDS: tl.constexpr, GROUPS: tl.constexpr, TOP_K: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_G: tl.constexpr,
):
    """Token t's codes (WORDS 8-byte words) and GROUPS scales to each routed pair's row; the output
    scales are token-major ([GROUPS, rows_out] stored, read transposed)."""
    t = tl.program_id(0).to(tl.int64)
    w = tl.arange(0, BLOCK_W)
    g = tl.arange(0, BLOCK_G)
    words = tl.load(codes_ptr + t * stride_c + w, mask=w < WORDS)
    scales = tl.load(scales_ptr + t * stride_s + g * stride_sg, mask=g < GROUPS)
    for j in tl.static_range(TOP_K):
        row = tl.load(pair_rows_ptr + t * TOP_K + j).to(tl.int64)
        ok = row >= 0  # -1: a skipped pair
        tl.store(out_ptr + row * WORDS + w, words, mask=(w < WORDS) & ok)
        tl.store(out_scales_ptr + g * rows_out + row, scales, mask=(g < GROUPS) & ok)


def grouped_codes(
    codes: torch.Tensor,  # [T', H] float8_e4m3fn, T' >= T
    scales: torch.Tensor,  # [T', H/128] fp32, any strides
    g: ExpertGrouping,
    num_tokens: int,  # T: the grouping's pairs are T * k
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
    """((codes [M, H], scales [M, H/128] token-major) in grouped order, row_expert [M] int32 (-1 on
    padding rows), pair_rows [T * k] int32 (-1 for skipped pairs)); M = max_blocks * BLOCK_M."""
    t, k = num_tokens, g.top_k
    h = codes.shape[1]
    if h % 8 or codes.stride(1) != 1:
        raise ValueError(f"grouped_codes: codes of {h} columns, strides {codes.stride()}: rows of 8-byte words expected")
    m = g.max_blocks * g.block_m
    dev = codes.device
    row_expert = torch.empty(m, dtype=torch.int32, device=dev)
    pair_rows = torch.full((t * k,), -1, dtype=torch.int32, device=dev)
    out = torch.empty(m, h, dtype=codes.dtype, device=dev)
    groups = scales.shape[1]
    out_scales = torch.empty(groups, m, dtype=torch.float32, device=dev)
    _row_table_kernel[(g.max_blocks,)](g.rows, g.block_expert, g.block_rows, row_expert, pair_rows, BLOCK_M=g.block_m)
    if t:
        words = codes.view(torch.int64)
        _scatter_codes_kernel[(t,)](
            words, scales, pair_rows, out.view(torch.int64), out_scales, m, words.stride(0), scales.stride(0),
            scales.stride(1),
            WORDS=h // 8, GROUPS=groups, TOP_K=k, BLOCK_W=triton.next_power_of_2(h // 8),
            BLOCK_G=triton.next_power_of_2(groups), num_warps=4,
        )
    return (out, out_scales.t()), row_expert, pair_rows
