"""Grouped expert GEMMs over an ExpertGrouping, FP8 (block-scaled, W8A8) or BF16.

- `moe_gate_up`: h = silu(x W_gate^T) * (x W_up^T) for each grouped pair, gate and up tiles of the
  same columns in one program so SwiGLU happens in the epilogue; h rows stay in grouped order.
- `moe_down`: y = p * (h W_down^T) written to the pair's own row t * k + j (p its routing weight).
- `moe_combine`: out[t] = sum_j y[t * k + j] over the pairs with a valid id, in fp32 (or y's rows in
  another order, each times its routing weight: kernels/moe_deep_gemm.py's output); optionally
  plus the gated shared expert, scale[t] * shared[t], in the same pass (rounded as torch rounds).

FP8: the activations (x, then h) are quantised once per call, per token in 128-groups
(kernels/fp8_quant.py), and the kernels read the FP8 codes and their group scales.

Grid: (weight tile, block). A program loads its block's expert and real-row count first and exits
if the block is unused, so the buffers are sized from T * k alone and the launch never syncs.
The kernels here are decode's: tokens are the MMA's narrow side (acc is [BLOCK_N, BLOCK_M]), as in
fp8_gemm. REGIMES picks them or prefill's large-M kernels (kernels/moe_gemm_large.py) and the rows
per block, by the mean rows per expert, in one table.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from minisgl.kernels.activations import Activations, tensor
from minisgl.kernels.fp8_gemm import num_sms
from minisgl.kernels.fp8_quant import GROUP
from minisgl.kernels.moe_align import ExpertGrouping
from minisgl.kernels.moe_blocks import MoeTile, block_rows, down_sums, expert_tiles, gate_up_sums
from minisgl.kernels.moe_gemm_large import down_large, fuses_quantisation, gate_up_large
from minisgl.kernels.tl_dtypes import TL_DTYPE


@triton.jit(do_not_specialize=["stride_xsk"])
def _moe_gate_up_kernel(
    x_ptr, xs_ptr, w_ptr, s_ptr, h_ptr, rows_ptr, block_expert_ptr, block_rows_ptr,
    top_k, inter, K,
    stride_xm, stride_xsm, stride_xsk, stride_we, stride_wn, stride_se, stride_sn, stride_hm,
    UP_SCALE_ROW: tl.constexpr, FP8: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    expert, pos, real, pair = block_rows(rows_ptr, block_expert_ptr, block_rows_ptr, tl.program_id(1), BLOCK_M)
    if expert < 0:
        return
    g_ptrs, gs_ptrs, gs_first, rn, n_ok = expert_tiles(
        w_ptr, s_ptr, expert, tl.program_id(0), stride_we, stride_wn, stride_se, stride_sn, inter, BLOCK_N, BLOCK_K
    )
    acc_g, acc_u = gate_up_sums(
        tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32),
        x_ptr, xs_ptr, pair, top_k, stride_xm, stride_xsm, stride_xsk, g_ptrs, gs_ptrs, gs_first, inter,
        stride_wn, stride_sn, real, n_ok, K, UP_SCALE_ROW, FP8, False, BLOCK_N, BLOCK_K, EVEN_K,
    )
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    h_ptrs = h_ptr + pos[None, :].to(tl.int64) * stride_hm + rn[:, None]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=n_ok[:, None] & real[None, :])


@triton.jit(do_not_specialize=["stride_hsk"])
def _moe_down_kernel(
    h_ptr, hs_ptr, w_ptr, s_ptr, y_ptr, p_ptr, rows_ptr, block_expert_ptr, block_rows_ptr,
    N, K,
    stride_hm, stride_hsm, stride_hsk, stride_we, stride_wn, stride_se, stride_sn, stride_ym,
    FP8: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    expert, pos, real, pair = block_rows(rows_ptr, block_expert_ptr, block_rows_ptr, tl.program_id(1), BLOCK_M)
    if expert < 0:
        return
    w_ptrs, s_ptrs, s_first, rn, n_ok = expert_tiles(w_ptr, s_ptr, expert, tl.program_id(0), stride_we, stride_wn,
                                                     stride_se, stride_sn, N, BLOCK_N, BLOCK_K)
    acc = down_sums(tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32), h_ptr, hs_ptr, pos, stride_hm, stride_hsm, stride_hsk,
                    w_ptrs, s_ptrs, s_first, real, n_ok, K, FP8, False, BLOCK_N, BLOCK_K, EVEN_K)
    p = tl.load(p_ptr + pair, mask=real, other=0.0).to(tl.float32)
    y_ptrs = y_ptr + pair[None, :].to(tl.int64) * stride_ym + rn[:, None]
    tl.store(y_ptrs, (acc * p[None, :]).to(y_ptr.dtype.element_ty), mask=n_ok[:, None] & real[None, :])


@triton.jit
def _moe_combine_kernel(
    y_ptr, ids_ptr, rows_ptr, p_ptr, shared_ptr, scale_ptr, residual_ptr, out_ptr, N, num_experts,
    stride_ym, stride_sm, stride_cm, stride_rm, stride_om,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, SHARED: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_DTYPE: tl.constexpr, INDIRECT: tl.constexpr, WEIGH: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = t * TOP_K + j + tl.zeros_like(rn)  # broadcast: the mask needs a vector
        e = tl.load(ids_ptr + pair)
        ok = n_ok & (e >= 0) & (e < num_experts)  # rows of skipped pairs were never written
        if INDIRECT:
            row = tl.load(rows_ptr + pair, mask=ok, other=0).to(tl.int64)
        else:
            row = t * TOP_K + j  # a scalar: the address arithmetic decode's combine always had
        y = tl.load(y_ptr + row * stride_ym + rn, mask=ok, other=0.0)
        if WEIGH:  # times the routing weight, rounded to y's dtype as moe_down's epilogue rounds it
            y = (tl.load(p_ptr + pair, mask=ok, other=0.0).to(tl.float32) * y.to(tl.float32)).to(y_ptr.dtype.element_ty)
        acc += y.to(tl.float32)
    if SHARED:
        # torch's `routed + scale * shared` (SharedAddend.add_to): each op exact in fp32, rounded where
        # torch rounds: the routed sum to x's dtype (the shared output's), the product and the sum to
        # the output's. The launch disables FMA contraction, which would skip the product's rounding.
        scale = tl.load(scale_ptr + t * stride_cm).to(tl.float32)
        shared = tl.load(shared_ptr + t * stride_sm + rn, mask=n_ok, other=0.0).to(tl.float32)
        gated = (scale * shared).to(BLOCK_DTYPE).to(tl.float32)
        acc = acc.to(shared_ptr.dtype.element_ty).to(tl.float32) + gated
    if RESIDUAL:  # torch's `residual + block_output`: the block's output rounded to its dtype, then the sum
        residual = tl.load(residual_ptr + t * stride_rm + rn, mask=n_ok, other=0.0).to(tl.float32)
        acc = acc.to(BLOCK_DTYPE).to(tl.float32) + residual
    tl.store(out_ptr + t * stride_om + rn, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


@dataclass(frozen=True)
class MoeRegime:
    """The kernels for one bucket of mean rows per expert: the grouping's rows per block and each GEMM's tile."""

    block_m: int
    gate_up: MoeTile
    down: MoeTile


_DECODE = MoeTile(64, 4, 4)
NARROW_BLOCK_N = 32  # decode's tiles where block_n 64 would leave SMs idle (see _tile)
# Prefill: the large-M kernels at 64-row blocks, gate_up 64 / down 128 columns, 4 warps, weights (and
# down's h) through TMA: the fastest candidate of bench_prefill.py --moe-only at 4K and 16K tokens
# on the 122B shapes, 1.12-1.16x the same tiles on pointers, which were 1.22-1.29x the tokens-narrow
# kernels at 128-row blocks (docs/benchmarks.md, twelfth session and "Calls 3 and 4"). From 128
# rows per expert on; 16-64 are decode's, measured (bench_moe.py --sweep; block_n 64, or 32 when 64
# leaves SMs idle): the tokens on the MMA's narrow side. gate_up's programs run both 64-column halves
# of a 128-group and write h's FP8 codes: no quantiser pass over h between the GEMMs.
_PREFILL = MoeRegime(64, MoeTile(64, 4, 3, large_m=True, tma=True, codes_in_halves=True),
                     MoeTile(128, 4, 3, large_m=True, tma=True))
REGIMES = {
    16: MoeRegime(16, _DECODE, _DECODE),
    32: MoeRegime(32, _DECODE, _DECODE),
    64: MoeRegime(64, _DECODE, _DECODE),
    128: _PREFILL,
    256: _PREFILL,
    512: _PREFILL,
}


def rows_bucket(num_pairs: int, num_experts: int) -> int:
    """REGIMES' key: the mean pairs per expert rounded up to a power of two in [16, 512] (a bucket,
    so a new token count compiles nothing new)."""
    return min(max(REGIMES), max(min(REGIMES), triton.next_power_of_2(triton.cdiv(num_pairs, num_experts))))


def regime(num_pairs: int, num_experts: int) -> MoeRegime:
    return REGIMES[rows_bucket(num_pairs, num_experts)]


SHARED_MEMORY_BUDGET = 160 << 10  # of the H200's 227 KiB per program: the rest for the epilogue's layout change


def _tile(tile: MoeTile, n: int, g: ExpertGrouping, operand_bytes: int, weight_tiles: int,
          override: dict[str, int]) -> MoeTile:
    """The regime's tile, narrowed where decode would leave SMs idle, and with no more pipeline
    stages than fit in shared memory: each stage holds a [BLOCK_M, 128] activation tile and
    `weight_tiles` [BLOCK_N, 128] weight tiles of `operand_bytes` each (BF16 and fp32 test models
    hold 2-4x FP8's bytes)."""
    if not tile.large_m and g.block_m <= 64 and triton.cdiv(n, tile.block_n) * g.max_blocks < 2 * num_sms(g.rows.device):
        tile = replace(tile, block_n=NARROW_BLOCK_N)  # decode: narrower tiles rather than idle SMs
    tile = replace(tile, **override)
    stage_bytes = (g.block_m + weight_tiles * tile.block_n) * GROUP * operand_bytes
    return replace(tile, num_stages=max(1, min(tile.num_stages, SHARED_MEMORY_BUDGET // stage_bytes)))


def _activations(x: torch.Tensor | Activations, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, group scales) for FP8 weights (x's own, when other layers quantised it already; rows
    padded, which the kernels never read); x itself twice for BF16 ones (the scales unread).
    For h this quantises every row, unused ones too (their garbage is never read): sizing by the
    real row count would need a host sync, and h is small beside the expert weights."""
    return Activations.of(x).fp8() if fp8 else (tensor(x), tensor(x))


# h between the GEMMs: in the activations' dtype, or already FP8 codes and their group scales
# (a large-M gate_up that quantised it in its epilogue).
Hidden = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def moe_gate_up(
    x: torch.Tensor | Activations,  # [T, H] bf16; Activations to share its quantisation with other layers
    gate_up: torch.Tensor,  # [E, 2I, H] fp8 or bf16, gate rows first
    gate_up_scale: torch.Tensor | None,  # [E, 2 * ceil(I/128), ceil(H/128)] fp32 for fp8
    g: ExpertGrouping,
    **override: int,  # MoeTile fields (benchmarks)
) -> Hidden:
    """h [max_blocks * BLOCK_M, I], rows in grouped order (unused rows unwritten)."""
    fp8 = gate_up_scale is not None
    xq, xs = _activations(x, fp8)
    x = tensor(x)
    e, two_i, k = gate_up.shape
    inter = two_i // 2
    tile = _tile(regime(x.shape[0] * g.top_k, e).gate_up, inter, g, gate_up.element_size(), 2, override)
    rows = g.rows.shape[0]
    if tile.large_m:
        if fuses_quantisation(tile, fp8, x.dtype):
            hq = torch.empty(rows, inter, dtype=gate_up.dtype, device=x.device)
            hs = torch.empty(triton.cdiv(inter, GROUP), rows, dtype=torch.float32, device=x.device).t()
            gate_up_large(xq, xs, gate_up, gate_up_scale, hq, hs, g, tile)
            return hq, hs
        h = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
        gate_up_large(xq, xs, gate_up, gate_up_scale, h, None, g, tile)
        return h
    h = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    scale = gate_up_scale if fp8 else gate_up  # unused pointer when bf16
    _moe_gate_up_kernel[(triton.cdiv(inter, tile.block_n), g.max_blocks)](
        xq, xs, gate_up, scale, h, g.rows, g.block_expert, g.block_rows,
        g.top_k, inter, k,
        xq.stride(0), xs.stride(0), xs.stride(1), gate_up.stride(0), gate_up.stride(1),
        scale.stride(0) if fp8 else 0, scale.stride(1) if fp8 else 0, h.stride(0),
        UP_SCALE_ROW=triton.cdiv(inter, GROUP), FP8=fp8,
        BLOCK_N=tile.block_n, BLOCK_M=g.block_m, BLOCK_K=GROUP, EVEN_K=k % GROUP == 0,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    return h


def moe_down(
    h: Hidden,  # from moe_gate_up
    down: torch.Tensor,  # [E, H, I]
    down_scale: torch.Tensor | None,  # [E, ceil(H/128), ceil(I/128)] fp32 for fp8
    weights: torch.Tensor,  # [T, k] routing weights
    g: ExpertGrouping,
    **override: int,  # MoeTile fields (benchmarks)
) -> torch.Tensor:
    """[T * k, H]: each grouped pair's weighted expert output in its own row (skipped pairs unwritten)."""
    e, n, k = down.shape
    fp8 = down_scale is not None
    hq, hs = h if isinstance(h, tuple) else _activations(h, fp8)
    dtype = torch.bfloat16 if isinstance(h, tuple) else h.dtype  # FP8 h only comes from bf16 activations
    y = torch.empty(weights.numel(), n, dtype=dtype, device=hq.device)
    tile = _tile(regime(weights.numel(), e).down, n, g, down.element_size(), 1, override)
    weights = weights.contiguous()
    if tile.large_m:
        down_large(hq, hs, down, down_scale, y, weights, g, tile)
        return y
    scale = down_scale if fp8 else down
    _moe_down_kernel[(triton.cdiv(n, tile.block_n), g.max_blocks)](
        hq, hs, down, scale, y, weights, g.rows, g.block_expert, g.block_rows,
        n, k,
        hq.stride(0), hs.stride(0), hs.stride(1), down.stride(0), down.stride(1),
        scale.stride(0) if fp8 else 0, scale.stride(1) if fp8 else 0, y.stride(0),
        FP8=fp8, BLOCK_N=tile.block_n, BLOCK_M=g.block_m, BLOCK_K=GROUP, EVEN_K=k % GROUP == 0,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    return y


def moe_combine(
    y: torch.Tensor,  # [T * k, H] from moe_down
    local_ids: torch.Tensor,  # [T, k]
    num_experts: int,
    dtype: torch.dtype,  # the routed sum's (x's)
    shared: torch.Tensor | None = None,  # [T, H] in `dtype`: the shared expert's output
    scale: torch.Tensor | None = None,  # [T, 1] any float dtype: its gate, sigmoid(logit) in the logit's dtype
    residual: torch.Tensor | None = None,  # [T, H] any float dtype: the stream the block's output joins
    pair_rows: torch.Tensor | None = None,  # [T * k] int32: y's row of each pair (default: the pair's own)
    weights: torch.Tensor | None = None,  # [T, k]: routing weights y is still to be multiplied by
) -> torch.Tensor:
    """[T, H]: the sum over each token's valid pairs (zero where a token has none), in `dtype`; with
    `shared`, plus scale * shared, bit for bit torch's `sum + scale * shared` on the rounded sum,
    in torch's promoted dtype (`dtype` unless the scale is wider); with `residual`, that block
    output added to it as torch's `residual + output` adds, in their promoted dtype (the decoder
    layer's residual add in the same pass: no [T, H] round trip of the block's output).

    The sigmoid stays outside, in torch ([T, 1]: one tiny launch, no [T, H] traffic), so the gate
    is torch's by construction: Triton's fp32 exp is an approximate ex2 that would move the bf16
    gate by an ulp now and then, and libdevice's expf has no interpreter for the CPU tests."""
    t, top_k = local_ids.shape
    n = y.shape[1]
    if (shared is None) != (scale is None):
        raise ValueError("the shared expert's output and its gate's scale come together")
    if shared is not None and shared.dtype != dtype:
        raise ValueError(f"the shared expert's output is {shared.dtype}, the routed sum {dtype}")
    if residual is not None and residual.shape != (t, n):
        raise ValueError(f"the residual is {tuple(residual.shape)}, the block's output {(t, n)}")
    fused = shared is not None
    block_dtype = torch.promote_types(dtype, scale.dtype) if fused else dtype
    out_dtype = block_dtype if residual is None else torch.promote_types(residual.dtype, block_dtype)
    out = torch.empty(t, n, dtype=out_dtype, device=y.device)
    shared, scale = (shared.contiguous(), scale) if fused else (y, y)  # y: pointers left unread
    residual_rows = y if residual is None else residual.contiguous()
    block_n = 1024
    _moe_combine_kernel[(t, triton.cdiv(n, block_n))](
        y, local_ids.contiguous(), y if pair_rows is None else pair_rows, y if weights is None else weights.contiguous(),
        shared, scale,
        residual_rows, out, n, num_experts,
        y.stride(0), shared.stride(0), scale.stride(0), residual_rows.stride(0), out.stride(0),
        TOP_K=top_k, BLOCK_N=block_n, SHARED=fused, RESIDUAL=residual is not None,
        BLOCK_DTYPE=TL_DTYPE[block_dtype], INDIRECT=pair_rows is not None, WEIGH=weights is not None,
        enable_fp_fusion=False,
    )
    return out
