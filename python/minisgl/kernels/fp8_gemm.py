"""Block-scaled FP8 GEMM: out = x @ W^T with W in float8_e4m3fn and one fp32 scale per 128x128 block.

Activations are quantised inside the kernel, per token in 128-wide groups (the checkpoints'
"dynamic" activation scheme): a K step loads a bf16 [rows, 128] tile, scales each row by its own
amax / 448, casts it to FP8, and multiplies on the FP8 tensor cores. Each K step's product is
rescaled by (weight block scale x row scale) into an fp32 accumulator, so one step must stay inside
one scale group: BLOCK_K is the group size.

The programs own weight rows and see the tokens as columns (acc is [BLOCK_N, BLOCK_M]): decode has
few tokens, and the tensor cores' wide dimension must be the weights', not the 1-64 tokens'.

Split-K: each K step is a serial chain (load, quantise, MMA, rescale), so a program's time grows
with its K steps, and decode has too few weight tiles to hide that chain behind other programs.
With SPLIT_K > 1 the programs also split K and write fp32 partial sums, added up afterwards.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0
GROUP = 128  # the checkpoints' block edge: weight blocks are GROUP x GROUP, activation groups 1 x GROUP


@triton.jit
def quantize_rows(x):
    """fp32 [R, C] -> (float8e4nv [R, C], fp32 scale [R]) with x ~= q * scale[:, None].

    An all-zero row (padding) gets scale 1, not 0, so no 0/0 reaches the tensor cores."""
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, amax / 448.0, 1.0)
    return (x / scale[:, None]).to(tl.float8e4nv), scale


@triton.jit
def scaled_dot(w, x, w_scale, FP8: tl.constexpr):
    """One K step's [BLOCK_N, BLOCK_M] product of a weight tile w [N, K] and a token tile x [M, K]
    (fp32): FP8 x FP8 rescaled by the weight rows' block scale and the tokens' group scale, or a
    plain product in w's dtype (FP8=False; w_scale unused). fp32 weights (test models) multiply in
    full fp32, not tf32, so they match the torch reference's rounding."""
    if FP8:
        xq, x_scale = quantize_rows(x)
        return tl.dot(w, tl.trans(xq)) * (w_scale[:, None] * x_scale[None, :])
    if w.dtype == tl.float32:
        return tl.dot(w, tl.trans(x), input_precision="ieee")
    return tl.dot(w, tl.trans(x.to(w.dtype)))


@triton.jit
def load_k_tile(ptrs, rows_ok, k_left, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """A [rows, BLOCK_K] tile of one K step; rows that are not ok, and columns past K, read as 0."""
    if EVEN_K:
        return tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    return tl.load(ptrs, mask=rows_ok[:, None] & (tl.arange(0, BLOCK_K) < k_left)[None, :], other=0.0)


@triton.jit
def load_scale(ptrs, rows_ok, FP8: tl.constexpr):
    """The weight rows' block scales for one K step (FP8), or 1."""
    if FP8:
        return tl.load(ptrs, mask=rows_ok, other=0.0)
    return tl.where(rows_ok, 1.0, 0.0)  # a tensor too: both returns must have one type


@triton.jit
def _fp8_linear_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, steps_per_split,
    stride_xm, stride_wn, stride_sn, stride_os, stride_om,
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
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(first, last):
        k_left = K - kb * BLOCK_K
        w = load_k_tile(w_ptrs, n_ok, k_left, BLOCK_K, EVEN_K)
        x = load_k_tile(x_ptrs, m_ok, k_left, BLOCK_K, EVEN_K)
        acc += scaled_dot(w, x.to(tl.float32), load_scale(s_ptrs + kb, n_ok, True), True)
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


def weight_block(n: int, m_blocks: int, num_sms: int) -> int:
    """Weight rows per program: the widest tile that still gives every SM about two programs (a
    decode GEMM streams each weight byte once, so idle SMs are lost bandwidth)."""
    for bn in (128, 64, 32):
        if triton.cdiv(n, bn) * m_blocks >= 2 * num_sms:
            return bn
    return 16


def k_splits(programs: int, k_steps: int, num_sms: int) -> int:
    """K splits: double until about 8 programs per SM (enough chains in flight to cover one's
    latency), keeping >= 3 K steps per split so the partial sums stay a small extra."""
    split = 1
    while programs * split < 8 * num_sms and k_steps >= 6 * split and split < 16:
        split *= 2
    return split


def fp8_linear(
    x: torch.Tensor,  # [..., K] bf16
    weight: torch.Tensor,  # [N, K] float8_e4m3fn
    scale_inv: torch.Tensor,  # [ceil(N/128), ceil(K/128)] fp32
    block_n: int | None = None,
    split_k: int | None = None,
    num_warps: int = 4,
    num_stages: int = 4,
) -> torch.Tensor:
    n, k = weight.shape
    if x.shape[-1] != k or weight.stride(1) != 1 or scale_inv.stride(1) != 1:
        raise ValueError(f"fp8_linear: x {tuple(x.shape)} vs weight {tuple(weight.shape)} (rows must be packed)")
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    bm = token_block(m)
    m_blocks = triton.cdiv(m, bm)
    sms = num_sms(x.device)
    bn = block_n or weight_block(n, m_blocks, sms)
    k_steps = triton.cdiv(k, GROUP)
    split = split_k or k_splits(triton.cdiv(n, bn) * m_blocks, k_steps, sms)
    steps = triton.cdiv(k_steps, split)
    split = triton.cdiv(k_steps, steps)  # no empty split
    out = torch.empty(split, m, n, dtype=x.dtype if split == 1 else torch.float32, device=x.device)
    _fp8_linear_kernel[(triton.cdiv(n, bn), m_blocks, split)](
        x2, weight, scale_inv, out, m, n, k, steps,
        x2.stride(0), weight.stride(0), scale_inv.stride(0), out.stride(0), out.stride(1),
        BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=GROUP, EVEN_K=k % GROUP == 0,
        num_warps=num_warps, num_stages=num_stages,
    )
    out = out[0] if split == 1 else out.sum(0).to(x.dtype)
    return out.view(*x.shape[:-1], n)
