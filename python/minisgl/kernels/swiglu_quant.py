"""The shared expert's SwiGLU and the FP8 quantisation of its output in one pass.

h = silu(gate) * up from the stacked gate/up GEMM's [T, 2I] output (gate's I columns first), written
in the activations' dtype and as FP8 codes with per-token 128-group scales (kernels/fp8_quant.py's
rule), so the down projection reads codes without another pass over h. In torch this is two
elementwise kernels over strided halves of the GEMM's output (~50 us each a layer in the 122B's
2 x 8K prefill step, docs/benchmarks.md), then the quantiser's pass: three launches, ~1.9x the
bytes of this one.

Rounded as torch rounds `F.silu(gate) * up`: silu in fp32 with the accurate exp (libdevice's expf,
not Triton's approximate exp2) and a correctly rounded division, rounded to the activations' dtype;
then the product of the two rounded values in fp32, rounded again. So h is torch's bit for bit, and
the codes are quantize_activations' of it. Triton's interpreter (CPU tests) has no libdevice: off
CUDA the exp is Triton's own.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minisgl.kernels.activations import Activations
from minisgl.kernels.fp8_format import FP8_MAX
from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE
from minisgl.kernels.fp8_quant import GROUP, group_tile, quantised_outputs, store_quantised, tile_rows


@triton.jit
def _silu_mul(g, u, DTYPE: tl.constexpr, ACCURATE_EXP: tl.constexpr):
    """torch's rounding of silu(g) * u for fp32 tiles of values in DTYPE; fp32 result."""
    e = libdevice.exp(-g) if ACCURATE_EXP else tl.exp(-g)
    silu = tl.math.div_rn(g, 1.0 + e).to(DTYPE).to(tl.float32)
    return (silu * u).to(DTYPE).to(tl.float32)


@triton.jit(do_not_specialize=["M", "stride_sg"])
def _swiglu_quant_kernel(
    gu_ptr, h_ptr, q_ptr, s_ptr, row_expert_ptr, M, I, stride_gm, stride_hm, stride_qm, stride_sg,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr, ACCURATE_EXP: tl.constexpr,
    STORE_H: tl.constexpr, SKIP_PADDING: tl.constexpr, TORCH_ROUNDING: tl.constexpr,
):
    rows, group, cols, ok, r64 = group_tile(M, I, ROWS, BLOCK)
    if SKIP_PADDING:  # masked loads and stores move no bytes
        ok = ok & (tl.load(row_expert_ptr + rows, mask=rows < M, other=-1) >= 0)[:, None]
    g = tl.load(gu_ptr + r64 * stride_gm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + r64 * stride_gm + I + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if TORCH_ROUNDING:
        h = _silu_mul(g, u, gu_ptr.dtype.element_ty, ACCURATE_EXP)  # masked columns: silu(0) * 0 = 0
    else:  # the Triton MoE's epilogue rule: fp32 throughout, fast exp and division
        h = g * tl.sigmoid(g) * u
    if STORE_H:
        tl.store(h_ptr + r64 * stride_hm + cols[None, :], h.to(h_ptr.dtype.element_ty), mask=ok)
    store_quantised(h, q_ptr, s_ptr, rows, group, cols, ok, r64, M, stride_qm, stride_sg, FP8_MAX)


def swiglu_quantised(gate_up: torch.Tensor) -> Activations:
    """gate_up [..., 2I] (gate's columns, then up's) -> Activations of h = silu(gate) * up [..., I]
    holding h and its FP8 codes and scales as Activations.fp8 would make them (rows padded for
    cuBLAS), so an FP8 layer reading it quantises nothing."""
    h, q, s = _swiglu(gate_up, store_h=True)
    return Activations.quantised(h.view(*gate_up.shape[:-1], h.shape[-1]), q, s)


def swiglu_codes(gate_up: torch.Tensor, row_expert: torch.Tensor | None = None,
                 torch_rounding: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up [M, 2I] -> the FP8 codes and scales of h alone (swiglu_quantised's, without writing h).
    With row_expert [M] (a grouped GEMM's rows, -1 on padding), the padding rows are not read and
    their codes not written (their scales are, and mean nothing). Without torch_rounding, h is the
    Triton MoE's gate_up epilogue's g * sigmoid(g) * u in fp32 (fast exp and division): over a
    [163840, 2048] gate_up output with 80% of its rows real (the 122B's 16K tokens on DeepGEMM's path)
    it took 384 us against torch's rounding's 998 (libdevice's exp and a correctly rounded division;
    H200, docs/benchmarks.md)."""
    _, q, s = _swiglu(gate_up, store_h=False, row_expert=row_expert, torch_rounding=torch_rounding)
    return q, s


def _swiglu(gate_up: torch.Tensor, store_h: bool, row_expert: torch.Tensor | None = None,
            torch_rounding: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    two_i = gate_up.shape[-1]
    if two_i % 2:
        raise ValueError(f"swiglu_quantised: gate_up's last dim {two_i} is not gate's and up's")
    gu = gate_up.reshape(-1, two_i)
    if gu.stride(1) != 1:
        gu = gu.contiguous()
    m, inter = gu.shape[0], two_i // 2
    h = torch.empty(m if store_h else 0, inter, dtype=gu.dtype, device=gu.device)
    q, s = quantised_outputs(m, inter, ROWS_MULTIPLE, gu.device)
    if m:
        rows = tile_rows(m)
        _swiglu_quant_kernel[(triton.cdiv(m, rows), triton.cdiv(inter, GROUP))](
            gu, h, q, s, gu if row_expert is None else row_expert, m, inter, gu.stride(0), h.stride(0), q.stride(0),
            s.stride(0), ROWS=rows, BLOCK=GROUP, FP8_MAX=FP8_MAX, ACCURATE_EXP=gu.is_cuda, STORE_H=store_h,
            SKIP_PADDING=row_expert is not None, TORCH_ROUNDING=torch_rounding,
        )
    return h, q, s.t()
