"""Per-head RMSNorm then partial rotate-half RoPE, in one launch: the q/k glue of full attention.

Replaces a norm kernel plus ~6 torch ops per tensor (neg, two cats, two muls, add), each a pass over
[T, heads, head_dim]. x is read in place through its token and head strides (the q half of the gated
q_proj output needs no copy); the output is a new contiguous [T, heads, head_dim].

The rounding chain is the torch reference's (layers/norm.py, then RotaryEmbedding.apply), op by op:
- y = norm(x) rounded to x's dtype, as rms_norm (kernels/rms_norm.py; both weight forms);
- on the first rotary_dim columns: a = y·cos and b = rotate_half(y)·sin, each rounded to the dtype,
  then a + b rounded. A product of two bf16 (or fp16) values is exact in fp32, so rounding it once
  gives torch's bf16 mul bit for bit; only the fp32 norm statistics can differ in their last bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernels.head_rows import head_row_tiles, head_rows_output
from minisgl.kernels.tl_dtypes import TL_DTYPE

_TILE = 2048  # elements a program covers: eight heads of 256


@triton.jit
def _normed(x, inv_rms, w, ONE_PLUS_W: tl.constexpr, DTYPE: tl.constexpr):
    """norm(x) with rms_norm's rounding, as fp32 holding a DTYPE value."""
    if ONE_PLUS_W:
        y = (x * inv_rms * (1.0 + w)).to(DTYPE)
    else:
        y = (w * (x * inv_rms).to(DTYPE).to(tl.float32)).to(DTYPE)
    return y.to(tl.float32)


# rows (tokens × heads) changes every step: left unspecialised, a new token count compiles nothing.
@triton.jit(do_not_specialize=["rows"])
def _norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr,
    stride_xt, stride_xh, stride_cos, stride_sin, rows, heads, eps,
    ONE_PLUS_W: tl.constexpr, DTYPE: tl.constexpr, HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]
    c = tl.arange(0, BLOCK_C)[None, :]
    t, h = r // heads, r % heads
    in_row = r < rows
    mask = in_row & (c < HEAD_DIM)
    x_row = x_ptr + t * stride_xt + h * stride_xh
    x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
    w = tl.load(w_ptr + c, mask=c < HEAD_DIM, other=0.0).to(tl.float32)
    y = _normed(x, inv_rms, w, ONE_PLUS_W, DTYPE)

    # rotate_half(y)[c] = -y[c + half] for c < half, y[c - half] below rotary_dim: the partner is
    # normalised from a second (cached) load of the row rather than shuffled across lanes.
    HALF: tl.constexpr = ROTARY_DIM // 2
    rotary = c < ROTARY_DIM
    partner = tl.where(c < HALF, c + HALF, c - HALF)
    rot_mask = in_row & rotary
    xp = tl.load(x_row + partner, mask=rot_mask, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=rotary, other=0.0).to(tl.float32)
    yp = _normed(xp, inv_rms, wp, ONE_PLUS_W, DTYPE)
    yp = tl.where(c < HALF, -yp, yp)
    cos = tl.load(cos_ptr + t * stride_cos + c, mask=rot_mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * stride_sin + c, mask=rot_mask, other=0.0).to(tl.float32)
    a = (y * cos).to(DTYPE).to(tl.float32)
    b = (yp * sin).to(DTYPE).to(tl.float32)
    out = tl.where(rotary, a + b, y)
    tl.store(y_ptr + r * HEAD_DIM + c, out.to(DTYPE), mask=mask)


def norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    zero_centered: bool,
    rotary_dim: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """RoPE(RMSNorm(x)) for x [T, heads, head_dim] (unit-stride last dim), weight [head_dim] and
    cos/sin [T, rotary_dim] in x's dtype -> contiguous [T, heads, head_dim] in x's dtype."""
    t, heads, d = x.shape
    if weight.shape != (d,) or (not zero_centered and weight.dtype != x.dtype):
        raise ValueError(f"weight {weight.dtype}{tuple(weight.shape)} must be [{d}] (in {x.dtype} for a plain norm)")
    if cos.shape != (t, rotary_dim) or sin.shape != cos.shape or cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ValueError(f"cos/sin must be {x.dtype} [{t}, {rotary_dim}]")
    if rotary_dim % 2 or not 0 < rotary_dim <= d:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and in (0, {d}]")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    out = head_rows_output(x, out)
    rows = t * heads
    if rows == 0:
        return out
    programs, block_r, block_c = head_row_tiles(rows, d, _TILE)
    _norm_rope_kernel[(programs,)](
        x, weight, cos, sin, out,
        x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), rows, heads, eps,
        ONE_PLUS_W=zero_centered, DTYPE=TL_DTYPE[x.dtype], HEAD_DIM=d, ROTARY_DIM=rotary_dim,
        BLOCK_R=block_r, BLOCK_C=block_c,
        enable_fp_fusion=False,  # y·cos + rot·sin fused into one FMA would skip torch's rounding of each product
    )
    return out
