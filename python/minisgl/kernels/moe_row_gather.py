"""Token rows of FP8 activations copied into the grouping's order, so that a prefill gate_up can read
its block of rows as one contiguous [BLOCK_M, 128] box per K step through the tensor memory
accelerator instead of gathering them row by row with pointer loads. Triton 3.6 can warp-specialise
a K loop only when every load in it is a TMA copy (kernels/moe_gemm_large.py), and Hopper's TMA has
no row gather of its own.

Rows past a used block's real ones are written as zero codes with zero scales, so every row that
gate_up reads is a finite product whatever it masks; unused blocks (run with no K step) are skipped."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernels.fp8_quant import GROUP
from minisgl.kernels.moe_align import ExpertGrouping
from minisgl.kernels.moe_blocks import block_rows


@triton.jit
def _gather_rows_kernel(x_ptr, xs_ptr, xg_ptr, xgs_ptr, rows_ptr, block_expert_ptr, block_rows_ptr, top_k, K,
                        stride_xm, stride_xsm, stride_xsk, stride_xgm, stride_xgsm, stride_xgsk,
                        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    expert, pos, real, pair = block_rows(rows_ptr, block_expert_ptr, block_rows_ptr, tl.program_id(0), BLOCK_M)
    if expert < 0:  # an unused block: gate_up runs no K step there, so its rows are never read
        return
    token = (pair // top_k).to(tl.int64)
    pos = pos.to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    for kb in range(tl.cdiv(K, BLOCK_K)):
        k = kb * BLOCK_K + cols
        k_ok = k < K
        x = tl.load(x_ptr + token[:, None] * stride_xm + k[None, :], mask=real[:, None] & k_ok[None, :], other=0.0)
        tl.store(xg_ptr + pos[:, None] * stride_xgm + k[None, :], x, mask=k_ok[None, :])
        s = tl.load(xs_ptr + token * stride_xsm + kb * stride_xsk, mask=real, other=0.0)
        tl.store(xgs_ptr + pos * stride_xgsm + kb * stride_xgsk, s)


def gather_grouped_rows(xq: torch.Tensor, xs: torch.Tensor, g: ExpertGrouping) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [max_blocks * block_m, K] in xq's dtype, scales [groups, max_blocks * block_m].t()):
    grouped position p holds the row of token rows[p] // top_k, or zeros past its block's real rows
    (unused blocks' rows are left unwritten).
    The scales lie K-step-major, so one K step's scales of a block are contiguous."""
    rows = g.max_blocks * g.block_m
    k = xq.shape[1]
    groups = triton.cdiv(k, GROUP)
    xg = torch.empty(rows, k, dtype=xq.dtype, device=xq.device)
    xgs = torch.empty(groups, rows, dtype=torch.float32, device=xq.device).t()
    _gather_rows_kernel[(g.max_blocks,)](
        xq, xs, xg, xgs, g.rows, g.block_expert, g.block_rows, g.top_k, k,
        xq.stride(0), xs.stride(0), xs.stride(1), xg.stride(0), xgs.stride(0), xgs.stride(1),
        BLOCK_M=g.block_m, BLOCK_K=GROUP, num_warps=4,
    )
    return xg, xgs
