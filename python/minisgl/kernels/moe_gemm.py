"""Grouped expert GEMMs over an ExpertGrouping, FP8 (block-scaled, W8A8) or BF16.

- `moe_gate_up`: h = silu(x W_gate^T) * (x W_up^T) for each grouped pair, gate and up tiles of the
  same columns in one program so SwiGLU happens in the epilogue; h rows stay in grouped order.
- `moe_down`: y = p * (h W_down^T) written to the pair's own row t * k + j (p its routing weight).
- `moe_combine`: out[t] = sum_j y[t * k + j] over the pairs with a valid id, in fp32.

FP8: the activations (x, then h) are quantised once per call, per token in 128-groups
(kernels/fp8_quant.py), and the kernels read the FP8 codes and their group scales.

Grid: (weight tile, block). A program loads its block's expert and real-row count first and exits
if the block is unused, so the buffers are sized from T * k alone and the launch never syncs.
Tokens are the MMA's narrow side (acc is [BLOCK_N, BLOCK_M]), as in fp8_gemm.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernels.fp8_gemm import load_k_tile, load_scale, num_sms, scaled_dot
from minisgl.kernels.fp8_quant import GROUP, quantize_activations
from minisgl.kernels.moe_align import ExpertGrouping


@triton.jit
def _block_rows(grouping_rows_ptr, block_expert_ptr, block_rows_ptr, pid_b, BLOCK_M: tl.constexpr):
    """(expert, positions of this block's rows in grouped order, which of them are real, pair ids)."""
    expert = tl.load(block_expert_ptr + pid_b)
    pos = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    real = tl.arange(0, BLOCK_M) < tl.load(block_rows_ptr + pid_b)
    pair = tl.load(grouping_rows_ptr + pos, mask=real, other=0)
    return expert, pos, real, pair


@triton.jit
def _expert_tiles(w_ptr, s_ptr, expert, stride_we, stride_wn, stride_se, stride_sn, N,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's weight rows of `expert`: (their first K step's pointers, their block-scale
    pointers, the rows, which rows exist)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    e = expert.to(tl.int64)
    w_ptrs = w_ptr + e * stride_we + rn[:, None].to(tl.int64) * stride_wn + tl.arange(0, BLOCK_K)[None, :]
    s_ptrs = s_ptr + e * stride_se + (rn // BLOCK_K) * stride_sn
    return w_ptrs, s_ptrs, rn, rn < N


@triton.jit
def _moe_gate_up_kernel(
    x_ptr, xs_ptr, w_ptr, s_ptr, h_ptr, rows_ptr, block_expert_ptr, block_rows_ptr,
    top_k, inter, K,
    stride_xm, stride_xsm, stride_we, stride_wn, stride_se, stride_sn, stride_hm,
    UP_SCALE_ROW: tl.constexpr, FP8: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    expert, pos, real, pair = _block_rows(rows_ptr, block_expert_ptr, block_rows_ptr, tl.program_id(1), BLOCK_M)
    if expert < 0:
        return
    g_ptrs, gs_ptrs, rn, n_ok = _expert_tiles(
        w_ptr, s_ptr, expert, stride_we, stride_wn, stride_se, stride_sn, inter, BLOCK_N, BLOCK_K
    )
    u_ptrs = g_ptrs + inter * stride_wn
    us_ptrs = gs_ptrs + UP_SCALE_ROW * stride_sn  # up's scale rows follow gate's ceil(I/128)
    token = (pair // top_k).to(tl.int64)
    x_ptrs = x_ptr + token[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    xs_ptrs = xs_ptr + token * stride_xsm
    acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        x = load_k_tile(x_ptrs, real, k_left, BLOCK_K, EVEN_K)
        xs = load_scale(xs_ptrs + kb, real, FP8)
        g = load_k_tile(g_ptrs, n_ok, k_left, BLOCK_K, EVEN_K)
        u = load_k_tile(u_ptrs, n_ok, k_left, BLOCK_K, EVEN_K)
        acc_g += scaled_dot(g, x, load_scale(gs_ptrs + kb, n_ok, FP8), xs, FP8)
        acc_u += scaled_dot(u, x, load_scale(us_ptrs + kb, n_ok, FP8), xs, FP8)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    h_ptrs = h_ptr + pos[None, :].to(tl.int64) * stride_hm + rn[:, None]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=n_ok[:, None] & real[None, :])


@triton.jit
def _moe_down_kernel(
    h_ptr, hs_ptr, w_ptr, s_ptr, y_ptr, p_ptr, rows_ptr, block_expert_ptr, block_rows_ptr,
    N, K,
    stride_hm, stride_hsm, stride_we, stride_wn, stride_se, stride_sn, stride_ym,
    FP8: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    expert, pos, real, pair = _block_rows(rows_ptr, block_expert_ptr, block_rows_ptr, tl.program_id(1), BLOCK_M)
    if expert < 0:
        return
    w_ptrs, s_ptrs, rn, n_ok = _expert_tiles(w_ptr, s_ptr, expert, stride_we, stride_wn, stride_se, stride_sn, N,
                                             BLOCK_N, BLOCK_K)
    h_ptrs = h_ptr + pos[:, None].to(tl.int64) * stride_hm + tl.arange(0, BLOCK_K)[None, :]
    hs_ptrs = hs_ptr + pos.to(tl.int64) * stride_hsm
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        h = load_k_tile(h_ptrs, real, k_left, BLOCK_K, EVEN_K)
        w = load_k_tile(w_ptrs, n_ok, k_left, BLOCK_K, EVEN_K)
        acc += scaled_dot(w, h, load_scale(s_ptrs + kb, n_ok, FP8), load_scale(hs_ptrs + kb, real, FP8), FP8)
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    p = tl.load(p_ptr + pair, mask=real, other=0.0).to(tl.float32)
    y_ptrs = y_ptr + pair[None, :].to(tl.int64) * stride_ym + rn[:, None]
    tl.store(y_ptrs, (acc * p[None, :]).to(y_ptr.dtype.element_ty), mask=n_ok[:, None] & real[None, :])


@triton.jit
def _moe_combine_kernel(
    y_ptr, ids_ptr, out_ptr, N, num_experts, stride_ym, stride_om,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        e = tl.load(ids_ptr + t * TOP_K + j + tl.zeros_like(rn))  # broadcast: the mask needs a vector
        ok = n_ok & (e >= 0) & (e < num_experts)  # rows of skipped pairs were never written
        acc += tl.load(y_ptr + (t * TOP_K + j) * stride_ym + rn, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_om + rn, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


def _weight_block(n: int, blocks: int, device: torch.device) -> int:
    """Weight rows per program: 64 keeps a wgmma-sized tile; 32 when that would leave SMs idle."""
    return 64 if triton.cdiv(n, 64) * blocks >= 2 * num_sms(device) else 32


def _stages(x: torch.Tensor, num_stages: int) -> int:
    """fp32 tiles are twice as large: at prefill's large row blocks 4 stages overflow shared memory."""
    return min(num_stages, 2) if x.element_size() == 4 else num_stages


def _activations(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, group scales) for FP8 weights; x itself twice for BF16 ones (the scales unread).
    For h this quantises every row, unused ones too (their garbage is never read): sizing by the
    real row count would need a host sync, and h is small beside the expert weights."""
    return quantize_activations(x) if fp8 else (x, x)


def moe_gate_up(
    x: torch.Tensor,  # [T, H] bf16
    gate_up: torch.Tensor,  # [E, 2I, H] fp8 or bf16, gate rows first
    gate_up_scale: torch.Tensor | None,  # [E, 2 * ceil(I/128), ceil(H/128)] fp32 for fp8
    g: ExpertGrouping,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 4,
) -> torch.Tensor:
    """[max_blocks * BLOCK_M, I] bf16, rows in grouped order (unused rows unwritten)."""
    _, two_i, k = gate_up.shape
    inter = two_i // 2
    fp8 = gate_up_scale is not None
    h = torch.empty(g.rows.shape[0], inter, dtype=x.dtype, device=x.device)
    bn = block_n or _weight_block(inter, g.max_blocks, x.device)
    xq, xs = _activations(x, fp8)
    scale = gate_up_scale if fp8 else gate_up  # unused pointer when bf16
    _moe_gate_up_kernel[(triton.cdiv(inter, bn), g.max_blocks)](
        xq, xs, gate_up, scale, h, g.rows, g.block_expert, g.block_rows,
        g.top_k, inter, k,
        xq.stride(0), xs.stride(0), gate_up.stride(0), gate_up.stride(1),
        scale.stride(0) if fp8 else 0, scale.stride(1) if fp8 else 0, h.stride(0),
        UP_SCALE_ROW=triton.cdiv(inter, GROUP), FP8=fp8,
        BLOCK_N=bn, BLOCK_M=g.block_m, BLOCK_K=GROUP, EVEN_K=k % GROUP == 0,
        num_warps=num_warps, num_stages=_stages(x, num_stages),
    )
    return h


def moe_down(
    h: torch.Tensor,  # [max_blocks * BLOCK_M, I] from moe_gate_up
    down: torch.Tensor,  # [E, H, I]
    down_scale: torch.Tensor | None,  # [E, ceil(H/128), ceil(I/128)] fp32 for fp8
    weights: torch.Tensor,  # [T, k] routing weights
    g: ExpertGrouping,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 4,
) -> torch.Tensor:
    """[T * k, H]: each grouped pair's weighted expert output in its own row (skipped pairs unwritten)."""
    _, n, k = down.shape
    fp8 = down_scale is not None
    y = torch.empty(weights.numel(), n, dtype=h.dtype, device=h.device)
    bn = block_n or _weight_block(n, g.max_blocks, h.device)
    hq, hs = _activations(h, fp8)
    scale = down_scale if fp8 else down
    _moe_down_kernel[(triton.cdiv(n, bn), g.max_blocks)](
        hq, hs, down, scale, y, weights.contiguous(), g.rows, g.block_expert, g.block_rows,
        n, k,
        hq.stride(0), hs.stride(0), down.stride(0), down.stride(1),
        scale.stride(0) if fp8 else 0, scale.stride(1) if fp8 else 0, y.stride(0),
        FP8=fp8, BLOCK_N=bn, BLOCK_M=g.block_m, BLOCK_K=GROUP, EVEN_K=k % GROUP == 0,
        num_warps=num_warps, num_stages=_stages(h, num_stages),
    )
    return y


def moe_combine(y: torch.Tensor, local_ids: torch.Tensor, num_experts: int, dtype: torch.dtype) -> torch.Tensor:
    """[T, H]: the sum over each token's valid pairs (zero where a token has none)."""
    t, top_k = local_ids.shape
    n = y.shape[1]
    out = torch.empty(t, n, dtype=dtype, device=y.device)
    block_n = 1024
    _moe_combine_kernel[(t, triton.cdiv(n, block_n))](
        y, local_ids.contiguous(), out, n, num_experts, y.stride(0), out.stride(0), TOP_K=top_k, BLOCK_N=block_n,
    )
    return out
