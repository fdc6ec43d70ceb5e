"""What both orientations of the grouped expert GEMMs share (kernels/moe_gemm.py for decode,
kernels/moe_gemm_large.py for prefill): the tile table's entry, a program's view of its block of
grouped rows and of its expert's weight rows, and the K loops of gate_up and down. TOKENS_WIDE picks
the orientation: tokens on the MMA's wide side (acc [BLOCK_M, BLOCK_N]) or its narrow side
(acc [BLOCK_N, BLOCK_M])."""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from minisgl.kernels.fp8_gemm import load_k_tile, load_scale, scaled_dot


@dataclass(frozen=True)
class MoeTile:
    block_n: int  # weight rows per program (gate_up: of gate, and as many of up)
    num_warps: int
    num_stages: int
    # The large-M kernels (moe_gemm_large.py): tokens on the MMA's wide side, acc [BLOCK_M, BLOCK_N],
    # programs visited in groups of group_m row blocks. Otherwise the decode kernels (acc [BLOCK_N, BLOCK_M]).
    large_m: bool = False
    group_m: int = 8
    tma: bool = False  # large-M, FP8, block_n dividing 128: operands through TMA (kernels/moe_gemm_large.py)
    # large-M gate_up at block_n 64, FP8: a program runs both halves of a 128-group and writes h's
    # FP8 codes (kernels/moe_gemm_large.py), so no quantiser pass over h
    codes_in_halves: bool = False


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


@triton.jit
def tile_dot(x, w, x_scale, ws_ptrs, ws_first, n_ok, kb, FP8: tl.constexpr, TOKENS_WIDE: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One K step's product of token rows x and weight rows w, rescaled. When BLOCK_N divides the
    128-row weight block, the tile's rows share one block scale: one scalar, applied per token
    rather than per output element (the same fp32 products, in fewer instructions and registers).
    One return: Triton's code generator also types the returns that follow a constexpr `if` holding
    one, and the two orientations' products have different shapes."""
    if FP8 and BLOCK_K % BLOCK_N == 0:
        w_scale = tl.load(ws_first + kb)
        if TOKENS_WIDE:
            product = tl.dot(x, tl.trans(w)) * (x_scale * w_scale)[:, None]
        else:
            product = tl.dot(w, tl.trans(x)) * (x_scale * w_scale)[None, :]
    elif TOKENS_WIDE:
        product = scaled_dot(x, w, x_scale, load_scale(ws_ptrs + kb, n_ok, FP8), FP8)
    else:
        product = scaled_dot(w, x, load_scale(ws_ptrs + kb, n_ok, FP8), x_scale, FP8)
    return product


@triton.jit
def gate_up_sums(acc_g, acc_u, x_ptr, xs_ptr, pair, top_k, stride_xm, stride_xsm, stride_xsk,
                 g_ptrs, gs_ptrs, gs_first, inter, stride_wn, stride_sn, real, n_ok, K,
                 UP_SCALE_ROW: tl.constexpr, FP8: tl.constexpr, TOKENS_WIDE: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The gate and up sums over K of one tile (from expert_tiles' gate tile; up's rows follow
    gate's I, its scale rows gate's ceil(I/128)): each K step's token tile is loaded once for both."""
    u_ptrs = g_ptrs + inter * stride_wn
    us_ptrs = gs_ptrs + UP_SCALE_ROW * stride_sn
    us_first = gs_first + UP_SCALE_ROW * stride_sn
    token = (pair // top_k).to(tl.int64)
    x_ptrs = x_ptr + token[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    xs_ptrs = xs_ptr + token * stride_xsm
    for kb in range(tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        x = load_k_tile(x_ptrs, real, k_left, BLOCK_K, EVEN_K)
        xs = load_scale(xs_ptrs + kb * stride_xsk, real, FP8)
        g = load_k_tile(g_ptrs, n_ok, k_left, BLOCK_K, EVEN_K)
        u = load_k_tile(u_ptrs, n_ok, k_left, BLOCK_K, EVEN_K)
        acc_g += tile_dot(x, g, xs, gs_ptrs, gs_first, n_ok, kb, FP8, TOKENS_WIDE, BLOCK_N, BLOCK_K)
        acc_u += tile_dot(x, u, xs, us_ptrs, us_first, n_ok, kb, FP8, TOKENS_WIDE, BLOCK_N, BLOCK_K)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    return acc_g, acc_u


@triton.jit
def down_sums(acc, h_ptr, hs_ptr, pos, stride_hm, stride_hsm, stride_hsk, w_ptrs, ws_ptrs, ws_first, real, n_ok, K,
              FP8: tl.constexpr, TOKENS_WIDE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              EVEN_K: tl.constexpr):
    """down's sum over K of one tile, over h's rows at grouped positions pos."""
    h_ptrs = h_ptr + pos[:, None].to(tl.int64) * stride_hm + tl.arange(0, BLOCK_K)[None, :]
    hs_ptrs = hs_ptr + pos.to(tl.int64) * stride_hsm
    for kb in range(tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        h = load_k_tile(h_ptrs, real, k_left, BLOCK_K, EVEN_K)
        w = load_k_tile(w_ptrs, n_ok, k_left, BLOCK_K, EVEN_K)
        hs = load_scale(hs_ptrs + kb * stride_hsk, real, FP8)
        acc += tile_dot(h, w, hs, ws_ptrs, ws_first, n_ok, kb, FP8, TOKENS_WIDE, BLOCK_N, BLOCK_K)
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc
