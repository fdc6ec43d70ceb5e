"""The routed experts' FP8 GEMMs at prefill sizes on DeepGEMM's M-grouped contiguous kernel
(warp-specialised, per-token 1x128 scales on x and 128x128 on the weights: the checkpoint's own
block scaling), when the `deep_gemm` package is installed. On the 122B's shapes at 16K tokens it
ran at 0.84 / 0.79 of the FP8 ceiling for gate_up / down on an H100, against 0.48 / 0.54 for our
Triton kernels (docs/benchmarks.md, thirty-fourth session).

DeepGEMM reads A's rows contiguous, each expert's in whole BLOCK_M-row blocks, and names each row's
expert (-1 on padding rows). So:
1. the grouping (moe_align) at BLOCK_M rows a block gives the order; x's FP8 codes and scales are
   moved into it, each token's row read once (kernels/moe_grouped_codes.py);
2. gate_up: [M, 2I] in the activations' dtype, rows in grouped order;
3. SwiGLU (the Triton MoE's rule) and h's FP8 quantisation in one pass over the real rows, h itself
   not written (kernels/swiglu_quant.py);
4. down: [M, H], unweighted;
5. moe_combine reads each pair's row through `pair_rows` and multiplies its routing weight.
Every size comes from T * k and the block table stays on the device: nothing syncs, and CUDA graphs
capture it once DeepGEMM has compiled its kernels (it compiles each shape's on first use).
"""
from __future__ import annotations

import functools
from types import ModuleType

import torch

from minisgl.kernels.activations import Activations
from minisgl.kernels.moe_align import align_experts
from minisgl.kernels.moe_grouped_codes import grouped_codes
from minisgl.kernels.swiglu_quant import swiglu_codes

BLOCK_M = 128  # DeepGEMM's row alignment for the contiguous layout on Hopper
# The whole routed call on the 122B's shapes against the Triton path's: 0.83x at 512 rows an expert
# (16K tokens at top-8 of 256 experts; H200), 1.02x at 256 (H100, before SwiGLU's fast rule): below
# 512 the rows' move into grouped order, the SwiGLU pass and the blocks padded to 128 rows cost about
# what DeepGEMM saves. On the 35B's shapes (H 2048, I 512) it was 1.00x at 512 (H100, before the fast rule).
MIN_ROWS_PER_EXPERT = 512


@functools.cache
def deep_gemm() -> ModuleType | None:
    try:
        import deep_gemm as module
    except ImportError:
        return None
    return module


def unavailable_reason(device: torch.device) -> str | None:
    """Why DeepGEMM cannot run the routed experts on `device`, or None when it can."""
    if device.type != "cuda":
        return f"DeepGEMM runs on CUDA devices, not {device}"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "DeepGEMM's block-scaled FP8 grouped GEMM here is Hopper's (sm_90)"
    if deep_gemm() is None:
        return "the deep_gemm package (DeepGEMM) is not installed"
    return None


def worth_it(num_pairs: int, num_experts: int, x: torch.Tensor, gate_up: torch.Tensor) -> bool:
    """DeepGEMM's path for this call: FP8 weights, bf16 activations (its output's dtype), and enough
    rows an expert on average."""
    return (gate_up.dtype == torch.float8_e4m3fn and x.dtype == torch.bfloat16
            and num_pairs >= MIN_ROWS_PER_EXPERT * num_experts)


def _gemm(a: tuple[torch.Tensor, torch.Tensor], w: torch.Tensor, w_scale: torch.Tensor, rows_expert: torch.Tensor,
          dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(a[0].shape[0], w.shape[1], dtype=dtype, device=w.device)
    # the scales are fp32 as given: no rounding to powers of two (that is Blackwell's UE8M0 format)
    deep_gemm().m_grouped_fp8_gemm_nt_contiguous(a, (w, w_scale), out, rows_expert, disable_ue8m0_cast=True)
    return out


def routed_experts(
    x: Activations,  # [T, H] bf16
    gate_up: torch.Tensor,  # [E, 2I, H] float8_e4m3fn, gate rows first
    gate_up_scale: torch.Tensor,  # [E, 2I/128, H/128] fp32
    down: torch.Tensor,  # [E, H, I] float8_e4m3fn
    down_scale: torch.Tensor,  # [E, H/128, I/128] fp32
    local_ids: torch.Tensor,  # [T, k]; ids outside [0, E) are skipped
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [M, H]: each routed pair's expert output, unweighted, rows in grouped order; pair_rows
    [T * k] int32: y's row of each pair, -1 for skipped pairs)."""
    g = align_experts(local_ids, gate_up.shape[0], BLOCK_M)
    a, row_expert, pair_rows = grouped_codes(*x.fp8(), g, local_ids.shape[0])
    # M is a multiple of BLOCK_M: h's codes have no padding rows past M
    h = swiglu_codes(_gemm(a, gate_up, gate_up_scale, row_expert, x.x.dtype), row_expert, torch_rounding=False)
    return _gemm(h, down, down_scale, row_expert, x.x.dtype), pair_rows
