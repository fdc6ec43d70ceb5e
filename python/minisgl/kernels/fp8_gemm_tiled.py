"""Block-scaled FP8 GEMM for many tokens (prefill): out [M, N] = x @ W^T, with x quantised per token in
128-groups (kernels/fp8_quant.py) and W in 128x128 blocks, as in kernels/fp8_gemm.py.

Here the tokens are plentiful, so a program owns a [BLOCK_M tokens, BLOCK_N weight rows] output tile
with both sides wgmma-sized (64-256), and walks K in 128-steps, each step's FP8 product rescaled by
its tokens' group scales and its weight block's scale into the fp32 accumulator. Tiles are visited in
groups of GROUP_M token tiles, so the programs of one wave share their weight tiles in L2. With
`tma`, the operand tiles come through Hopper's tensor memory accelerator (descriptors built on the
host; rows past M or K read as zero), which frees the warps from address arithmetic.

Compile discipline: the token count M and the scales' stride (M, token-major scales) change every
step, so neither specialises the kernel; the tile shape comes from a small table keyed on M's bucket.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minisgl.kernels.fp8_gemm import load_k_tile, scaled_dot
from minisgl.kernels.fp8_quant import GROUP


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    tma: bool = False


@triton.jit(do_not_specialize=["M", "stride_xsk"])
def _fp8_tiled_kernel(
    x_src, xs_ptr, w_src, s_ptr, out_ptr, M, N, K,
    stride_xm, stride_xsk, stride_wn, stride_sn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    TMA: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    rk = tl.arange(0, BLOCK_K)
    if not TMA:  # (a constexpr branch: with TMA, x_src and w_src are descriptors)
        x_ptrs = x_src + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
        w_ptrs = w_src + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    xs_ptrs = xs_ptr + rm
    s_ptrs = s_ptr + (rn // BLOCK_K) * stride_sn  # BLOCK_N > BLOCK_K: each row its block's scale
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BLOCK_K)):
        if TMA:
            x = x_src.load([pid_m * BLOCK_M, kb * BLOCK_K])
            w = w_src.load([pid_n * BLOCK_N, kb * BLOCK_K])
        else:
            k_left = K - kb * BLOCK_K
            x = load_k_tile(x_ptrs, m_ok, k_left, BLOCK_K, EVEN_K)
            w = load_k_tile(w_ptrs, n_ok, k_left, BLOCK_K, EVEN_K)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        x_scale = tl.load(xs_ptrs + kb * stride_xsk, mask=m_ok, other=0.0)
        if BLOCK_K % BLOCK_N == 0:  # the tile's rows share one weight block: a scalar scale, and one
            # multiply per token instead of one per output element on each K step's serial chain
            w_scale = tl.load(s_ptr + (pid_n * BLOCK_N // BLOCK_K) * stride_sn + kb)
            acc += tl.dot(x, tl.trans(w)) * (x_scale * w_scale)[:, None]
        else:
            acc += scaled_dot(x, w, x_scale, tl.load(s_ptrs + kb, mask=n_ok, other=0.0), True)
    out = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def tma_fits(xq: torch.Tensor, weight: torch.Tensor) -> bool:
    """TMA needs 16-byte aligned bases and row strides (FP8: K a multiple of 16); K under one box
    (tiny test models) stays on pointers."""
    return xq.shape[1] >= GROUP and all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 for t in (xq, weight))


def gemm_tiled(
    xq: torch.Tensor,  # [M, K] float8_e4m3fn, from quantize_activations
    xs: torch.Tensor,  # [M, ceil(K/128)] fp32, token-major
    weight: torch.Tensor,  # [N, K] float8_e4m3fn
    scale_inv: torch.Tensor,  # [ceil(N/128), ceil(K/128)] fp32
    out_dtype: torch.dtype,
    tile: TileConfig,
) -> torch.Tensor:
    m, k = xq.shape
    n = weight.shape[0]
    if xs.stride(0) != 1:
        raise ValueError(f"gemm_tiled: activation scales must be token-major, got strides {xs.stride()}")
    out = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    x_src, w_src = xq, weight
    tma = tile.tma and tma_fits(xq, weight)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_src = TensorDescriptor.from_tensor(xq, [tile.block_m, GROUP])
        w_src = TensorDescriptor.from_tensor(weight, [tile.block_n, GROUP])
    grid = (triton.cdiv(m, tile.block_m) * triton.cdiv(n, tile.block_n),)
    _fp8_tiled_kernel[grid](
        x_src, xs, w_src, scale_inv, out, m, n, k,
        xq.stride(0), xs.stride(1), weight.stride(0), scale_inv.stride(0), out.stride(0),
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=GROUP, GROUP_M=tile.group_m,
        TMA=tma, EVEN_K=k % GROUP == 0,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    return out
