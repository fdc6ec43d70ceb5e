"""Grouped expert GEMMs for prefill: the same contract as kernels/moe_gemm.py's decode kernels, with
the tokens on the MMA's wide side.

At prefill an expert sees hundreds of rows, so a program owns a [BLOCK_M rows, BLOCK_N weight rows]
output tile (acc [BLOCK_M, BLOCK_N], two warpgroups at 128 rows) instead of decode's [BLOCK_N,
BLOCK_M]. BLOCK_K is the 128-group, so each K step's FP8 product takes one scale per row of either
operand (one scalar for the weights when BLOCK_N divides 128). The programs walk groups of GROUP_M
row blocks per weight tile, so the blocks of one expert run side by side and read its weight tiles
from L2; unused blocks (past the grouping's last) exit at once.

gate_up with BLOCK_N = 128 and FP8 weights quantises h in its epilogue (each program holds whole
128-groups of its rows): down then reads FP8 codes and scales, and the separate quantiser pass over
h (read bf16, write FP8) is gone. The rule is kernels/fp8_quant.py's on the bf16-rounded h, so the
codes are those the separate pass would write. At BLOCK_N = 64 a tile holds half a group; with
`codes_in_halves` a program runs the two halves of one group in turn (each the 64-wide tile's own
K loop and registers) and quantises both by their joint amax.

FP8 tiles inside one weight block (BLOCK_N dividing 128) can read their operands through the
tensor memory accelerator (`tma`): weight tiles from a descriptor over [experts x rows, K], and
down's rows of h (contiguous in grouped order) from one over h. A weight tile that runs past its
last row reads the rows after it (a gate tile up's, an up or down tile the next expert's) into
columns the store masks; gate_up zeroes them before its epilogue quantises h. Accumulating in
units of each K step's scale, so that the MMA adds into the accumulator in place
(acc = acc * c_{k-1} / c_k + x_k w_k) instead of into a product tile as large as it, was measured
too: 10-25% slower on gate_up (docs/benchmarks.md, twelfth session).
"""
from __future__ import annotations

import functools
import logging

import torch
import triton
import triton.language as tl

from minisgl.kernels.fp8_format import FP8_MAX
from minisgl.kernels.fp8_gemm import load_k_tile
from minisgl.kernels.fp8_quant import GROUP, group_codes, group_scale, quantize_tile
from minisgl.kernels.moe_align import ExpertGrouping
from minisgl.kernels.moe_blocks import MoeTile, block_rows, down_sums, expert_tiles, gate_up_sums

logger = logging.getLogger(__name__)
_FP8_MAX = tl.constexpr(FP8_MAX)  # a jitted function reads only constexpr globals


@triton.jit
def _scaled_step(acc, x, w, x_scale, w_scale):
    """acc plus one K step's FP8 product of token rows x and weight rows w, whose rows share the
    weight block scale w_scale."""
    return acc + tl.dot(x, tl.trans(w)) * (x_scale * w_scale)[:, None]


@triton.jit
def _weight_tile(w_desc, w_ptrs, row, kb, n_ok, K, TMA: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """K step kb of a weight tile: rows `row` on of the descriptor's view, or through w_ptrs (the
    tile's pointers at K step 0)."""
    if TMA:
        return w_desc.load([row, kb * BLOCK_K])
    return load_k_tile(w_ptrs + kb * BLOCK_K, n_ok, K - kb * BLOCK_K, BLOCK_K, EVEN_K)


@triton.jit
def _gate_up_fp8_sums(x_ptr, xs_ptr, pair, top_k, stride_xm, stride_xsm, stride_xsk, w_desc, g_ptrs, g_row,
                      gs_first, inter, stride_wn, up_scale_offset, real, n_ok, K,
                      TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """gate and up sums over K of one FP8 tile whose rows share a weight block (BLOCK_N | 128)."""
    token = (pair // top_k).to(tl.int64)
    x_ptrs = x_ptr + token[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    xs_ptrs = xs_ptr + token * stride_xsm
    u_ptrs = g_ptrs + inter * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BLOCK_K)):
        x = load_k_tile(x_ptrs + kb * BLOCK_K, real, K - kb * BLOCK_K, BLOCK_K, EVEN_K)
        xs = tl.load(xs_ptrs + kb * stride_xsk, mask=real, other=1.0)
        g = _weight_tile(w_desc, g_ptrs, g_row, kb, n_ok, K, TMA, BLOCK_K, EVEN_K)
        u = _weight_tile(w_desc, u_ptrs, g_row + inter, kb, n_ok, K, TMA, BLOCK_K, EVEN_K)
        acc_g = _scaled_step(acc_g, x, g, xs, tl.load(gs_first + kb))
        acc_u = _scaled_step(acc_u, x, u, xs, tl.load(gs_first + up_scale_offset + kb))
    return acc_g, acc_u


@triton.jit
def _down_fp8_sums(h_desc, h_ptr, hs_ptr, pos, h_row, stride_hm, stride_hsm, stride_hsk, w_desc, w_ptrs, w_row,
                   ws_first, real, n_ok, K, TMA: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """down's sum over K of one FP8 tile whose rows share a weight block (BLOCK_N | 128)."""
    h_ptrs = h_ptr + pos[:, None].to(tl.int64) * stride_hm + tl.arange(0, BLOCK_K)[None, :]
    hs_ptrs = hs_ptr + pos.to(tl.int64) * stride_hsm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BLOCK_K)):
        if TMA:
            h = h_desc.load([h_row, kb * BLOCK_K])
        else:
            h = load_k_tile(h_ptrs + kb * BLOCK_K, real, K - kb * BLOCK_K, BLOCK_K, EVEN_K)
        w = _weight_tile(w_desc, w_ptrs, w_row, kb, n_ok, K, TMA, BLOCK_K, EVEN_K)
        hs = tl.load(hs_ptrs + kb * stride_hsk, mask=real, other=1.0)
        acc = _scaled_step(acc, h, w, hs, tl.load(ws_first + kb))
    return acc


@triton.jit
def _grouped_program(num_blocks, num_n_tiles, GROUP_M: tl.constexpr):
    """(row block, weight tile) of this program: GROUP_M consecutive row blocks per weight tile."""
    pid = tl.program_id(0)
    per_group = GROUP_M * num_n_tiles
    first = (pid // per_group) * GROUP_M
    blocks_here = tl.minimum(num_blocks - first, GROUP_M)
    return first + (pid % per_group) % blocks_here, (pid % per_group) // blocks_here


@triton.jit
def _program_tiles(rows_ptr, block_expert_ptr, block_rows_ptr, w_ptr, s_ptr, num_blocks, N,
                   stride_we, stride_wn, stride_se, stride_sn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's row block and weight tile indices, its block of grouped rows
    (moe_blocks.block_rows) and its expert's weight tile (moe_blocks.expert_tiles), in grouped order."""
    pid_b, pid_n = _grouped_program(num_blocks, tl.cdiv(N, BLOCK_N), GROUP_M)
    expert, pos, real, pair = block_rows(rows_ptr, block_expert_ptr, block_rows_ptr, pid_b, BLOCK_M)
    w_ptrs, s_ptrs, s_first, rn, n_ok = expert_tiles(
        w_ptr, s_ptr, expert, pid_n, stride_we, stride_wn, stride_se, stride_sn, N, BLOCK_N, BLOCK_K
    )
    return pid_b, pid_n, expert, pos, real, pair, w_ptrs, s_ptrs, s_first, rn, n_ok


@triton.jit
def _h_tile(x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, expert, tile, pair, real, top_k, inter, K, rows_per_expert,
            stride_xm, stride_xsm, stride_xsk, stride_we, stride_wn, stride_se, stride_sn,
            UP_SCALE_ROW: tl.constexpr, FP8: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """SwiGLU's h (fp32) of this block's rows over weight tile `tile` of the expert's I columns, with
    the columns and which of them exist; columns past I hold 0."""
    g_ptrs, gs_ptrs, gs_first, rn, n_ok = expert_tiles(
        w_ptr, s_ptr, expert, tile, stride_we, stride_wn, stride_se, stride_sn, inter, BLOCK_N, BLOCK_K
    )
    if FP8 and BLOCK_K % BLOCK_N == 0:
        acc_g, acc_u = _gate_up_fp8_sums(
            x_ptr, xs_ptr, pair, top_k, stride_xm, stride_xsm, stride_xsk, w_desc, g_ptrs,
            expert * rows_per_expert + tile * BLOCK_N, gs_first, inter, stride_wn, UP_SCALE_ROW * stride_sn,
            real, n_ok, K, TMA, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
        )
    else:
        acc_g, acc_u = gate_up_sums(
            tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32),
            x_ptr, xs_ptr, pair, top_k, stride_xm, stride_xsm, stride_xsk, g_ptrs, gs_ptrs, gs_first, inter,
            stride_wn, stride_sn, real, n_ok, K, UP_SCALE_ROW, FP8, True, BLOCK_N, BLOCK_K, EVEN_K,
        )
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    if TMA:  # columns past I came from other rows (up's, or the next expert's)
        h = tl.where(n_ok[None, :], h, 0.0)
    return h, rn, n_ok


@triton.jit(do_not_specialize=["num_blocks", "stride_xsk", "stride_hsk"])
def _moe_gate_up_large_kernel(
    x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, h_ptr, hs_ptr, rows_ptr, block_expert_ptr, block_rows_ptr,
    num_blocks, top_k, inter, K, rows_per_expert,
    stride_xm, stride_xsm, stride_xsk, stride_we, stride_wn, stride_se, stride_sn, stride_hm,
    stride_hsm, stride_hsk,
    UP_SCALE_ROW: tl.constexpr, FP8: tl.constexpr, QUANT_H: tl.constexpr, HALVES: tl.constexpr,
    TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_b, pid_n = _grouped_program(num_blocks, tl.cdiv(inter, BLOCK_N * HALVES), GROUP_M)
    expert, pos, real, pair = block_rows(rows_ptr, block_expert_ptr, block_rows_ptr, pid_b, BLOCK_M)
    if expert < 0:
        return
    h_rows = h_ptr + pos[:, None].to(tl.int64) * stride_hm
    hs_ptrs = hs_ptr + pos.to(tl.int64) * stride_hsm + pid_n * stride_hsk  # QUANT_H: a program is a 128-group
    if HALVES == 2:
        # The two 64-column halves of one 128-group in turn, the first held as the bf16 the codes
        # are made of (h is rounded to the activations' dtype first, as the separate pass reads it).
        h0, rn0, ok0 = _h_tile(x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, expert, 2 * pid_n, pair, real, top_k, inter, K,
                               rows_per_expert, stride_xm, stride_xsm, stride_xsk, stride_we, stride_wn, stride_se,
                               stride_sn, UP_SCALE_ROW, FP8, TMA, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
        h0 = h0.to(tl.bfloat16)
        h1, rn1, ok1 = _h_tile(x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, expert, 2 * pid_n + 1, pair, real, top_k, inter,
                               K, rows_per_expert, stride_xm, stride_xsm, stride_xsk, stride_we, stride_wn,
                               stride_se, stride_sn, UP_SCALE_ROW, FP8, TMA, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
        h0, h1 = h0.to(tl.float32), h1.to(tl.bfloat16).to(tl.float32)
        scale = group_scale(tl.maximum(tl.max(tl.abs(h0), axis=1), tl.max(tl.abs(h1), axis=1)), _FP8_MAX)
        tl.store(h_rows + rn0[None, :], group_codes(h0, scale, _FP8_MAX).to(h_ptr.dtype.element_ty),
                 mask=real[:, None] & ok0[None, :])
        tl.store(h_rows + rn1[None, :], group_codes(h1, scale, _FP8_MAX).to(h_ptr.dtype.element_ty),
                 mask=real[:, None] & ok1[None, :])
        tl.store(hs_ptrs, scale, mask=real)
    else:
        h, rn, n_ok = _h_tile(x_ptr, xs_ptr, w_ptr, w_desc, s_ptr, expert, pid_n, pair, real, top_k, inter, K,
                              rows_per_expert, stride_xm, stride_xsm, stride_xsk, stride_we, stride_wn, stride_se,
                              stride_sn, UP_SCALE_ROW, FP8, TMA, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
        ok = real[:, None] & n_ok[None, :]
        if QUANT_H:  # BLOCK_N is one 128-group: each row's group is whole here (columns past I are 0).
            q, scale = quantize_tile(h.to(tl.bfloat16).to(tl.float32), _FP8_MAX)
            tl.store(h_rows + rn[None, :], q.to(h_ptr.dtype.element_ty), mask=ok)
            tl.store(hs_ptrs, scale, mask=real)
        else:
            tl.store(h_rows + rn[None, :], h.to(h_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["num_blocks", "stride_hsk"])
def _moe_down_large_kernel(
    h_ptr, h_desc, hs_ptr, w_ptr, w_desc, s_ptr, y_ptr, p_ptr, rows_ptr, block_expert_ptr, block_rows_ptr,
    num_blocks, N, K,
    stride_hm, stride_hsm, stride_hsk, stride_we, stride_wn, stride_se, stride_sn, stride_ym,
    FP8: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_b, pid_n, expert, pos, real, pair, w_ptrs, s_ptrs, s_first, rn, n_ok = _program_tiles(
        rows_ptr, block_expert_ptr, block_rows_ptr, w_ptr, s_ptr, num_blocks, N,
        stride_we, stride_wn, stride_se, stride_sn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
    )
    if expert < 0:
        return
    if FP8 and BLOCK_K % BLOCK_N == 0:
        acc = _down_fp8_sums(h_desc, h_ptr, hs_ptr, pos, pid_b * BLOCK_M, stride_hm, stride_hsm, stride_hsk, w_desc,
                             w_ptrs, expert * N + pid_n * BLOCK_N, s_first, real, n_ok, K, TMA,
                             BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    else:
        acc = down_sums(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), h_ptr, hs_ptr, pos, stride_hm, stride_hsm,
                        stride_hsk, w_ptrs, s_ptrs, s_first, real, n_ok, K, FP8, True, BLOCK_N, BLOCK_K, EVEN_K)
    p = tl.load(p_ptr + pair, mask=real, other=0.0).to(tl.float32)
    y_ptrs = y_ptr + pair[:, None].to(tl.int64) * stride_ym + rn[None, :]
    tl.store(y_ptrs, (acc * p[:, None]).to(y_ptr.dtype.element_ty), mask=real[:, None] & n_ok[None, :])


def _descriptor(t: torch.Tensor, rows: int, use: bool) -> object:
    """A TMA descriptor over t's [rows, K] view in [rows, GROUP] boxes, or t itself when unused."""
    if not use:
        return t
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t.reshape(-1, t.shape[-1]), [rows, GROUP])


def _tma(tile: MoeTile, fp8: bool, *operands: torch.Tensor) -> bool:
    """tile.tma where TMA can read the operands: contiguous (so the descriptor's 2-D view is not a
    copy), 16-byte aligned bases and rows, K at least one box. Where it cannot, the log says so once."""
    if not (tile.tma and fp8 and GROUP % tile.block_n == 0):
        return False
    for t in operands:
        if not (t.is_contiguous() and t.shape[-1] >= GROUP and t.data_ptr() % 16 == 0 and t.stride(-2) % 16 == 0):
            _pointer_loads_instead(tuple(t.shape), tuple(t.stride()))
            return False
    return True


@functools.cache
def _pointer_loads_instead(shape: tuple[int, ...], stride: tuple[int, ...]) -> None:
    logger.info("MoE prefill GEMMs: an operand of shape %s, strides %s, is not TMA-readable (contiguous, "
                "16-byte aligned, K >= %d): pointer loads instead, ~1.1x slower", shape, stride, GROUP)


def fuses_quantisation(tile: MoeTile, fp8: bool, dtype: torch.dtype) -> bool:
    """Whether gate_up at this tile writes h as FP8 codes and group scales (see the module docstring):
    FP8 weights, bf16 activations, one 128-group per program (one tile, or two halves in turn)."""
    whole_groups = tile.block_n == GROUP or (tile.codes_in_halves and 2 * tile.block_n == GROUP)
    return fp8 and dtype == torch.bfloat16 and tile.large_m and whole_groups


def _programs(g: ExpertGrouping, n: int, block_n: int) -> tuple[int]:
    return (g.max_blocks * triton.cdiv(n, block_n),)


def gate_up_large(
    xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None, h: torch.Tensor,
    hs: torch.Tensor | None, g: ExpertGrouping, tile: MoeTile,
) -> None:
    """Launch: h [rows, I], FP8 codes with their scales hs [rows, groups] (token-major, as
    quantize_activations lays them out) when fuses_quantisation, else in the activations' dtype."""
    _, two_i, k = w.shape
    inter = two_i // 2
    fp8 = s is not None
    scale = s if fp8 else w  # unused pointers when bf16
    h_scale = hs if hs is not None else h
    tma = _tma(tile, fp8, w)
    halves = 2 if hs is not None and 2 * tile.block_n == GROUP else 1
    _moe_gate_up_large_kernel[_programs(g, inter, halves * tile.block_n)](
        xq, xs, w, _descriptor(w, tile.block_n, tma), scale, h, h_scale, g.rows, g.block_expert, g.block_rows,
        g.max_blocks, g.top_k, inter, k, two_i,
        xq.stride(0), xs.stride(0), xs.stride(1), w.stride(0), w.stride(1),
        scale.stride(0) if fp8 else 0, scale.stride(1) if fp8 else 0, h.stride(0),
        hs.stride(0) if hs is not None else 0, hs.stride(1) if hs is not None else 0,
        UP_SCALE_ROW=triton.cdiv(inter, GROUP), FP8=fp8, QUANT_H=hs is not None, HALVES=halves,
        TMA=tma,
        BLOCK_M=g.block_m, BLOCK_N=tile.block_n, BLOCK_K=GROUP, EVEN_K=k % GROUP == 0, GROUP_M=tile.group_m,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )


def down_large(
    hq: torch.Tensor, hs: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None, y: torch.Tensor,
    weights: torch.Tensor, g: ExpertGrouping, tile: MoeTile,
) -> None:
    """Launch: y [T * k, H], each grouped pair's weighted expert output in its own row."""
    _, n, k = w.shape
    fp8 = s is not None
    scale = s if fp8 else w
    tma = _tma(tile, fp8, w, hq)
    _moe_down_large_kernel[_programs(g, n, tile.block_n)](
        hq, _descriptor(hq, g.block_m, tma), hs, w, _descriptor(w, tile.block_n, tma), scale, y, weights,
        g.rows, g.block_expert, g.block_rows, g.max_blocks, n, k,
        hq.stride(0), hs.stride(0), hs.stride(1), w.stride(0), w.stride(1),
        scale.stride(0) if fp8 else 0, scale.stride(1) if fp8 else 0, y.stride(0),
        FP8=fp8, TMA=tma, BLOCK_M=g.block_m, BLOCK_N=tile.block_n, BLOCK_K=GROUP, EVEN_K=k % GROUP == 0,
        GROUP_M=tile.group_m, num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
