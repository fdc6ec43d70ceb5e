"""Attention's output gate o · sigmoid(gate) in one launch (Qwen3.5's gated attention).

The gate is read in place from the gated q_proj output ([T, heads, 2·head_dim] = [query | gate] per
head), through its token and head strides: no reshape copy, and one pass instead of two (sigmoid,
then the product). Rounding as torch's `o * torch.sigmoid(gate)`: sigmoid computed in fp32 and
rounded to the dtype, then the product rounded.

With quantise it also writes o_proj's FP8 input (the 122B's [T, 8,192] rows: the quantiser's separate
pass re-read them, 12 calls a 2 x 8K prefill step) as kernels/rms_norm.py's norms do theirs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernels.activations import Activations
from minisgl.kernels.fp8_format import FP8_MAX, GROUP, rows_split_into_groups
from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE
from minisgl.kernels.fp8_quant import quantised_outputs, store_row_codes
from minisgl.kernels.head_rows import head_row_tiles, head_rows_output

_TILE = 2048  # elements a program covers: eight heads of 256


# rows (tokens × heads) and the scales' row stride change every step: left unspecialised, a new
# token count compiles nothing.
@triton.jit(do_not_specialize=["rows", "stride_sg"])
def _sigmoid_gate_kernel(
    o_ptr, g_ptr, y_ptr, q_ptr, s_ptr, stride_ot, stride_oh, stride_gt, stride_gh, stride_sg, rows, heads,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr,
    QUANT: tl.constexpr, FP8_MAX: tl.constexpr,
):
    # A [BLOCK_R, GROUPS, GROUP] tile of (token, head) rows: with codes each [.., g, :] is a 128-group.
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None, None]
    g = tl.arange(0, GROUPS)[None, :, None]
    c = g * GROUP + tl.arange(0, GROUP)[None, None, :]
    t, h = r // heads, r % heads
    mask = (r < rows) & (c < HEAD_DIM)
    o = tl.load(o_ptr + t * stride_ot + h * stride_oh + c, mask=mask, other=0.0)
    gate = tl.load(g_ptr + t * stride_gt + h * stride_gh + c, mask=mask, other=0.0).to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-gate))).to(o.dtype).to(tl.float32)
    y = (o.to(tl.float32) * s).to(o.dtype)
    tl.store(y_ptr + r * HEAD_DIM + c, y, mask=mask)
    if QUANT:
        store_row_codes(y.to(tl.float32), q_ptr, s_ptr, r, g, c, mask, rows, HEAD_DIM, heads, stride_sg,
                        BLOCK_R, GROUPS, GROUP, FP8_MAX)


def sigmoid_gate(
    o: torch.Tensor, gate: torch.Tensor, out: torch.Tensor | None = None, quantise: bool = False,
) -> torch.Tensor | Activations:
    """o · sigmoid(gate) for o and gate [T, heads, head_dim] of one dtype, each with a unit-stride
    last dim (else copied) -> contiguous [T, heads, head_dim]. quantise (head_dim a multiple of 128):
    also y's FP8 codes and scales, by the quantiser's rule on the stored y, returned with y as
    [T, heads · head_dim] Activations (o_proj's input, quantised in this pass instead of another)."""
    if gate.shape != o.shape or gate.dtype != o.dtype:
        raise ValueError(f"gate {gate.dtype}{tuple(gate.shape)} must match o {o.dtype}{tuple(o.shape)}")
    if quantise and not rows_split_into_groups(o.shape):
        raise ValueError(f"quantise: heads of {tuple(o.shape)} do not split into {GROUP}-groups")
    o, gate = (a if a.stride(-1) == 1 else a.contiguous() for a in (o, gate))
    t, heads, d = o.shape
    out = head_rows_output(o, out)
    q, scales = quantised_outputs(t, heads * d, ROWS_MULTIPLE, o.device) if quantise else (out, out)
    rows = t * heads
    if rows:
        programs, block_r, block_c = head_row_tiles(rows, d, _TILE)
        group = min(block_c, GROUP)
        _sigmoid_gate_kernel[(programs,)](
            o, gate, out, q, scales, o.stride(0), o.stride(1), gate.stride(0), gate.stride(1), scales.stride(0),
            rows, heads, HEAD_DIM=d, BLOCK_R=block_r, GROUPS=block_c // group, GROUP=group, QUANT=quantise,
            FP8_MAX=FP8_MAX,
        )
    return Activations.quantised(out.view(t, heads * d), q, scales.t()) if quantise else out
