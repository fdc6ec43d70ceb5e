"""Per-token, 128-group FP8 quantisation of activations: the checkpoints' "dynamic" scheme.

Quantising once per call, before the GEMM, rather than inside it: a GEMM program that quantises its
own activation tile repeats the work for every weight tile, and the reduce-divide-cast sits on each
K step's serial chain, which kept that loop from overlapping its loads (decode is latency-bound).

One program quantises a [rows, 128] tile (rows tokens, one group): at prefill sizes a program per
(token, group) spent its time launching 128-element programs, ~8x slower than the bytes allow, so
from 512 tokens a tile holds ROWS. Decode batches take DECODE_ROWS: on the H200 in CUDA graphs
(benchmarks/bench_quantiser_tiles.py, docs/benchmarks.md, 2026-12-04) 32-row tiles took 6.6 us at
200 tokens x 2048 and 4-row tiles 2.9 us, 3.3 -> 2.8 us at 64 tokens (200 calls a 35B decode step:
0.75 ms of 25). Fewer tokens than
that take the next power of two: the masked rows still pay the correctly rounded divisions, which
made a one-token tile of 32 rows 4.7x slower (6.6 vs 1.4 us; 2 ms of a 48-layer decode step at B=1).

The scales come out token-major ([M, groups] with stride (1, M)): a GEMM's K step reads the scales of
its consecutive tokens from consecutive addresses, and it is the layout cuBLAS's 1x128 block scaling
takes as is.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernels.fp8_format import FP8_DTYPE, FP8_MAX, GROUP

ROWS = 32  # tokens per program from PREFILL_TOKENS on: a 4096-element tile, 16 per thread at 4 warps
DECODE_ROWS = 4  # tokens per program below PREFILL_TOKENS
PREFILL_TOKENS = 512


@triton.jit
def group_scale(amax, FP8_MAX: tl.constexpr):
    """A group's scale from its amax: amax / 448, 1 for an all-zero group. Correctly rounded, as
    torch's division, so FP8 rounding boundaries fall where the reference's do."""
    return tl.where(amax > 0, tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX, tl.float32)), 1.0)


@triton.jit
def group_codes(x, scale, FP8_MAX: tl.constexpr):
    """The codes of an fp32 tile [..., columns] of one group a row, scale [...] (not yet FP8-typed)."""
    q = tl.math.div_rn(x, tl.broadcast_to(tl.expand_dims(scale, -1), x.shape))
    return tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX)  # x / (amax / 448) can round past 448


@triton.jit
def quantize_tile(x, FP8_MAX: tl.constexpr):
    """(codes, scale per group) of an fp32 tile [..., GROUP], a group per run of its last dim."""
    scale = group_scale(tl.max(tl.abs(x), axis=-1), FP8_MAX)
    return group_codes(x, scale, FP8_MAX), scale


@triton.jit
def group_tile(M, K, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """This program's [ROWS, BLOCK] tile of an [M, K] matrix in 128-groups (grid: row blocks, then
    groups): (rows, group, columns, mask, the rows as int64 offsets [ROWS, 1])."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    group = tl.program_id(1)
    cols = group * BLOCK + tl.arange(0, BLOCK)
    ok = (rows < M)[:, None] & (cols < K)[None, :]
    return rows, group, cols, ok, rows.to(tl.int64)[:, None]


@triton.jit
def store_quantised(x, q_ptr, s_ptr, rows, group, cols, ok, r64, M, stride_qm, stride_sg, FP8_MAX: tl.constexpr):
    """The codes of the fp32 tile x (group_tile's) and its rows' scales, stored."""
    q, scale = quantize_tile(x, FP8_MAX)
    tl.store(q_ptr + r64 * stride_qm + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + group.to(tl.int64) * stride_sg + rows, scale, mask=rows < M)


@triton.jit
def store_row_codes(y, q_ptr, s_ptr, r, g, c, mask, rows, cols, rows_per_token, stride_sg,
                    BLOCK_R: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr, FP8_MAX: tl.constexpr):
    """The codes and scales of a [BLOCK_R, GROUPS, GROUP] fp32 tile of rows r of width cols (column c
    = g * GROUP + j), rows_per_token rows a token (a token's features are its rows flattened): codes
    at row r's own offset, scales [groups, tokens]. Masked columns must be zeros: a group past the
    row's end then has scale 1 and is not stored."""
    codes, scale = quantize_tile(y, FP8_MAX)  # scale [BLOCK_R, GROUPS]
    # Stored 8 codes a thread, as a bf16 tile's loads and stores hold them: at 16 (the widest FP8
    # store) Triton kept the tile in both layouts and converted between them (11 barriers against 4
    # for a 3,072-wide norm row, compiled for sm_90).
    tl.store(q_ptr + tl.max_contiguous(r * cols + c, [1, 1, 8]), codes.to(q_ptr.dtype.element_ty), mask=mask)
    r2, g2 = tl.reshape(r, (BLOCK_R, 1)), tl.reshape(g, (1, GROUPS))
    group = (r2 % rows_per_token) * (cols // GROUP) + g2
    tl.store(s_ptr + group * stride_sg + r2 // rows_per_token, scale, mask=(r2 < rows) & (g2 * GROUP < cols))


@triton.jit(do_not_specialize=["M", "stride_sg"])
def _quantize_groups_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_qm, stride_sg,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr,
):
    rows, group, cols, ok, r64 = group_tile(M, K, ROWS, BLOCK)
    x = tl.load(x_ptr + r64 * stride_xm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    store_quantised(x, q_ptr, s_ptr, rows, group, cols, ok, r64, M, stride_qm, stride_sg, FP8_MAX)


def tile_rows(m: int) -> int:
    """Tokens per program for m tokens: ROWS at prefill sizes, else at most DECODE_ROWS."""
    return ROWS if m >= PREFILL_TOKENS else min(DECODE_ROWS, triton.next_power_of_2(m))


def quantised_outputs(m: int, k: int, rows_multiple: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised codes [M', k] and group scales [groups, M'] (token-major once transposed) for m
    tokens, M' = m rounded up to rows_multiple."""
    padded = triton.cdiv(m, rows_multiple) * rows_multiple
    q = torch.empty(padded, k, dtype=FP8_DTYPE, device=device)
    return q, torch.empty(triton.cdiv(k, GROUP), padded, dtype=torch.float32, device=device)


def quantize_activations(x: torch.Tensor, rows_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8_e4m3fn [M', K], fp32 scales [M', ceil(K/128)], token-major) with
    x ~= q * scale per group; the same rule as layers/fp8.quantize_block_fp8 with block (1, 128).
    M' is M rounded up to rows_multiple (cuBLAS wants the scales' columns 16-byte aligned); the
    rows past M are left unwritten, so only a GEMM whose rows are independent may read them."""
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    q, s = quantised_outputs(m, k, rows_multiple, x.device)
    if m:
        rows = tile_rows(m)
        _quantize_groups_kernel[(triton.cdiv(m, rows), s.shape[0])](
            x, q, s, m, k, x.stride(0), q.stride(0), s.stride(0),
            ROWS=rows, BLOCK=GROUP, FP8_MAX=FP8_MAX,
        )
    return q, s.t()
