"""Per-token, 128-group FP8 quantisation of activations: the checkpoints' "dynamic" scheme.

Quantising once per call, before the GEMM, rather than inside it: a GEMM program that quantises its
own activation tile repeats the work for every weight tile, and the reduce-divide-cast sits on each
K step's serial chain, which kept that loop from overlapping its loads (decode is latency-bound).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.layers.fp8 import FP8_DTYPE

GROUP = 128  # the checkpoints' block edge: weight blocks are GROUP x GROUP, activation groups 1 x GROUP


@triton.jit
def _quantize_groups_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    cols = group * BLOCK + tl.arange(0, BLOCK)
    ok = cols < K
    x = tl.load(x_ptr + row * stride_xm + cols, mask=ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    # Correctly rounded divisions, as torch's, so FP8 rounding boundaries fall where the reference's do.
    scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)  # an all-zero group (padding) must not give 0/0
    q = tl.math.div_rn(x, tl.zeros_like(x) + scale)
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)  # x / (amax / 448) can round past 448
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * stride_sm + group, scale)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8_e4m3fn [M, K], fp32 scales [M, ceil(K/128)]) with x ~= q * scale per group;
    the same rule as layers/fp8.quantize_block_fp8 with block (1, 128)."""
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    groups = triton.cdiv(k, GROUP)
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    s = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    if m:
        _quantize_groups_kernel[(m, groups)](x, q, s, k, x.stride(0), q.stride(0), s.stride(0), BLOCK=GROUP)
    return q, s
