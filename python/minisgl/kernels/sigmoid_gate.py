"""Attention's output gate o · sigmoid(gate) in one launch (Qwen3.5's gated attention).

The gate is read in place from the gated q_proj output ([T, heads, 2·head_dim] = [query | gate] per
head), through its token and head strides: no reshape copy, and one pass instead of two (sigmoid,
then the product). Rounding as torch's `o * torch.sigmoid(gate)`: sigmoid computed in fp32 and
rounded to the dtype, then the product rounded.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernels.head_rows import head_row_tiles, head_rows_output

_TILE = 2048  # elements a program covers: eight heads of 256


# rows (tokens × heads) changes every step: left unspecialised, a new token count compiles nothing.
@triton.jit(do_not_specialize=["rows"])
def _sigmoid_gate_kernel(
    o_ptr, g_ptr, y_ptr, stride_ot, stride_oh, stride_gt, stride_gh, rows, heads,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]
    c = tl.arange(0, BLOCK_C)[None, :]
    t, h = r // heads, r % heads
    mask = (r < rows) & (c < HEAD_DIM)
    o = tl.load(o_ptr + t * stride_ot + h * stride_oh + c, mask=mask, other=0.0)
    g = tl.load(g_ptr + t * stride_gt + h * stride_gh + c, mask=mask, other=0.0).to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-g))).to(o.dtype).to(tl.float32)
    tl.store(y_ptr + r * HEAD_DIM + c, (o.to(tl.float32) * s).to(o.dtype), mask=mask)


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """o · sigmoid(gate) for o and gate [T, heads, head_dim] of one dtype, each with a unit-stride
    last dim (else copied) -> contiguous [T, heads, head_dim]."""
    if gate.shape != o.shape or gate.dtype != o.dtype:
        raise ValueError(f"gate {gate.dtype}{tuple(gate.shape)} must match o {o.dtype}{tuple(o.shape)}")
    o, gate = (a if a.stride(-1) == 1 else a.contiguous() for a in (o, gate))
    t, heads, d = o.shape
    out = head_rows_output(o, out)
    rows = t * heads
    if rows == 0:
        return out
    programs, block_r, block_c = head_row_tiles(rows, d, _TILE)
    _sigmoid_gate_kernel[(programs,)](
        o, gate, out, o.stride(0), o.stride(1), gate.stride(0), gate.stride(1), rows, heads,
        HEAD_DIM=d, BLOCK_R=block_r, BLOCK_C=block_c,
    )
    return out
