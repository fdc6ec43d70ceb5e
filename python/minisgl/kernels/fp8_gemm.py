"""Block-scaled FP8 GEMM for decode: out = x @ W^T with W in float8_e4m3fn and one fp32 scale per
128x128 block (kernels/fp8_linear.py picks this kernel or a large-M one by the token count).

Activations are quantised per token in 128-wide groups (the checkpoints' "dynamic" scheme) once per
call by kernels/fp8_quant.py; the GEMM then streams FP8 weight and activation tiles and multiplies
on the FP8 tensor cores. Each K step's product is rescaled by (weight block scale x token group
scale) into an fp32 accumulator, so one step must stay inside one scale group: BLOCK_K is the group.

The programs own weight rows and see the tokens as columns (acc is [BLOCK_N, BLOCK_M]): decode has
few tokens, and the tensor cores' wide dimension must be the weights', not the 1-64 tokens'.

Split-K: decode has too few weight tiles to give every SM enough loads in flight, so the programs
also split K and write fp32 partial sums, added up afterwards; the split is capped so the partials
stay a small fraction of the weight bytes.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from minisgl.kernels.fp8_quant import GROUP


@triton.jit
def scaled_dot(w, x, w_scale, x_scale, FP8: tl.constexpr):
    """One K step's [BLOCK_N, BLOCK_M] product of a weight tile w [N, K] and a token tile x [M, K]:
    FP8 x FP8 rescaled by the weight rows' block scale and the tokens' group scale, or a plain
    product in w's dtype (FP8=False; the scales unused). fp32 weights (test models) multiply in
    full fp32, not tf32, so they match the torch reference's rounding."""
    if FP8:
        return tl.dot(w, tl.trans(x)) * (w_scale[:, None] * x_scale[None, :])
    if w.dtype == tl.float32:
        return tl.dot(w, tl.trans(x.to(tl.float32)), input_precision="ieee")
    return tl.dot(w, tl.trans(x.to(w.dtype)))


@triton.jit
def load_k_tile(ptrs, rows_ok, k_left, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """A [rows, BLOCK_K] tile of one K step; rows that are not ok, and columns past K, read as 0."""
    if EVEN_K:
        return tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    return tl.load(ptrs, mask=rows_ok[:, None] & (tl.arange(0, BLOCK_K) < k_left)[None, :], other=0.0)


@triton.jit
def load_scale(ptrs, rows_ok, FP8: tl.constexpr):
    """One K step's scales of a tile's rows (weight blocks or token groups; FP8), or 1."""
    if FP8:
        return tl.load(ptrs, mask=rows_ok, other=0.0)
    return tl.where(rows_ok, 1.0, 0.0)  # a tensor too: both returns must have one type


@triton.jit(do_not_specialize=["M", "steps_per_split", "stride_xsk"])
def _fp8_linear_kernel(
    x_ptr, xs_ptr, w_ptr, s_ptr, out_ptr, M, N, K, steps_per_split,
    stride_xm, stride_xsm, stride_xsk, stride_wn, stride_sn, stride_os, stride_om,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)  # this program's K steps: [first, last)
    first = pid_k * steps_per_split
    last = tl.minimum(first + steps_per_split, tl.cdiv(K, BLOCK_K))
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + (first * BLOCK_K + rk)[None, :]
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (first * BLOCK_K + rk)[None, :]
    s_ptrs = s_ptr + (rn // BLOCK_K) * stride_sn
    xs_ptrs = xs_ptr + rm * stride_xsm
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(first, last):
        k_left = K - kb * BLOCK_K
        w = load_k_tile(w_ptrs, n_ok, k_left, BLOCK_K, EVEN_K)
        x = load_k_tile(x_ptrs, m_ok, k_left, BLOCK_K, EVEN_K)
        x_scale = load_scale(xs_ptrs + kb * stride_xsk, m_ok, True)
        acc += scaled_dot(w, x, load_scale(s_ptrs + kb, n_ok, True), x_scale, True)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    out = out_ptr + pid_k * stride_os + rm[None, :].to(tl.int64) * stride_om + rn[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


@lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Multiprocessors to fill (1 off CUDA: Triton's CPU interpreter runs one program at a time)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def token_block(m: int) -> int:
    """Token columns per program: the tensor cores' minimum of 16, up to 64 for prefill."""
    return min(64, max(16, triton.next_power_of_2(m)))


# Weight rows per program: one warpgroup's wgmma tile. In bench_moe.py --sweep on the H200, 32 and
# 128 were slower than 64 at every 122B projection shape for M = 1-64, but one (N=12288, M=1).
WEIGHT_ROWS = 64


def k_splits(programs: int, k_steps: int, m: int, num_sms: int) -> int:
    """K splits: only while the programs fill under 3/4 of the SMs (a full wave of unsplit programs
    beat any split in the sweep: the partial sums cost two more kernels), with >= 3 K steps per
    split and the fp32 partials (split x m x N x 4 bytes) within 1/8 of the weight bytes (N x K),
    i.e. split <= K / (32 m)."""
    split = 1
    while 4 * programs * split < 3 * num_sms and k_steps >= 6 * split and 2 * split * 32 * m <= k_steps * GROUP:
        split *= 2
    return split


def gemm_split_k(
    xq: torch.Tensor,  # [M, K] float8_e4m3fn, from quantize_activations
    xs: torch.Tensor,  # [M, ceil(K/128)] fp32, token-major
    weight: torch.Tensor,  # [N, K] float8_e4m3fn
    scale_inv: torch.Tensor,  # [ceil(N/128), ceil(K/128)] fp32
    out_dtype: torch.dtype,
    block_n: int | None = None,
    split_k: int | None = None,
    num_warps: int = 4,
    num_stages: int = 5,
    block_m: int | None = None,
) -> torch.Tensor:
    """[M, N] = dequant(xq) @ dequant(weight)^T: the decode kernel (tokens the narrow side, K split
    while the weight tiles are too few to fill the SMs). `block_m` overrides token_block (benchmarks)."""
    m, k = xq.shape
    n = weight.shape[0]
    bm = block_m or token_block(m)
    m_blocks = triton.cdiv(m, bm)
    bn = block_n or WEIGHT_ROWS
    k_steps = triton.cdiv(k, GROUP)
    split = split_k or k_splits(triton.cdiv(n, bn) * m_blocks, k_steps, m, num_sms(xq.device))
    steps = triton.cdiv(k_steps, split)
    split = triton.cdiv(k_steps, steps)  # no empty split
    out = torch.empty(split, m, n, dtype=out_dtype if split == 1 else torch.float32, device=xq.device)
    _fp8_linear_kernel[(triton.cdiv(n, bn), m_blocks, split)](
        xq, xs, weight, scale_inv, out, m, n, k, steps,
        xq.stride(0), xs.stride(0), xs.stride(1), weight.stride(0), scale_inv.stride(0), out.stride(0), out.stride(1),
        BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=GROUP, EVEN_K=k % GROUP == 0,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out[0] if split == 1 else out.sum(0).to(out_dtype)
