"""Row-wise RMSNorm in one launch: the 1 + w (Qwen3.5), plain w (Qwen3) and SiLU-gated (GDN output)
variants, optionally after a fused residual add. Each replaces the ~8 small torch ops of a norm.

The rounding order is that of the torch reference (layers/norm.py), step by step, with
r = rsqrt(mean(x²) + eps) in fp32:
- zero-centered: y = x·r·(1 + w) in fp32, rounded once to x's dtype;
- plain: y = w · (x·r rounded to x's dtype), rounded to the dtype of that product;
- gated: the plain y, times silu(z) in fp32, rounded to x's dtype;
- residual: h = x + delta rounded to x's dtype (as torch's add), and y is the norm of that h.

Inputs [..., C] need a unit-stride last dim and are read through a row stride, so strided views
(the q half of a fused q/gate projection) are not copied; outputs are new contiguous tensors.

`quantise=True` also writes y's FP8 codes and per-token 128-group scales in the same pass, exactly
kernels/fp8_quant.py's of the stored y (its rule applied to y as rounded), and returns the two as
Activations, so the FP8 projections that read a norm's output quantise nothing: at the 122B's 2 x 8K
prefill step the quantiser's separate pass over a norm's output re-read [T, 3072] or [T, 8192] bf16
rows, 132 times a step. A token's features are its rows of y flattened ([T, heads, C]: heads x C),
and C must be a multiple of 128, so that each group is 128 of one row's columns.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from minisgl.kernels.activations import Activations
from minisgl.kernels.fp8_format import FP8_MAX, rows_split_into_groups
from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE
from minisgl.kernels.fp8_quant import GROUP, quantised_outputs, store_row_codes
from minisgl.kernels.tl_dtypes import TL_DTYPE

# A program covers about this many elements: one row at hidden 4096, sixteen per-head rows of 128.
# With codes, 8 warps even for 2,048: GDN's output norm (16 rows of 128) took 320 instead of 354 us
# at 16K tokens on an H100 (docs/benchmarks.md, twenty-ninth session); without them no difference.
_TILE = 2048


# rows (and the scales' row stride, the padded token count) change every step: left unspecialised,
# a new token count never compiles a new variant.
@triton.jit(do_not_specialize=["rows", "stride_sg"])
def _rms_norm_kernel(
    x_ptr, delta_ptr, h_ptr, z_ptr, w_ptr, y_ptr, q_ptr, s_ptr,
    stride_x, stride_delta, stride_h, stride_z, stride_y, stride_sg, rows, cols, rows_per_token, eps,
    ONE_PLUS_W: tl.constexpr, GATED: tl.constexpr, HAS_DELTA: tl.constexpr, QUANT: tl.constexpr,
    PRODUCT_DTYPE: tl.constexpr, BLOCK_R: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    # A [BLOCK_R, GROUPS, GROUP] tile: column g * GROUP + j of each row. With codes, each [.., g, :] is
    # one 128-group of a token, whose amax reduces the last axis in the tile's own layout (no reshape).
    # The FP8 stores may still make Triton lay the tile out otherwise, which can reorder a row's sum
    # of squares: y with codes may differ from y without them by an ulp (tests/gpu/test_norm_quant.py).
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None, None]
    g = tl.arange(0, GROUPS)[None, :, None]
    c = g * GROUP + tl.arange(0, GROUP)[None, None, :]
    mask = (r < rows) & (c < cols)
    x = tl.load(x_ptr + r * stride_x + c, mask=mask, other=0.0)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + r * stride_delta + c, mask=mask, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(x.dtype)
        tl.store(h_ptr + r * stride_h + c, x, mask=mask)
    xf = x.to(tl.float32)
    ss = tl.sum(tl.sum(xf * xf, axis=2), axis=1)
    normed = xf * tl.rsqrt(ss / cols + eps)[:, None, None]
    w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
    if ONE_PLUS_W:
        y = normed * (1.0 + w)
    else:
        y = (w * normed.to(x.dtype).to(tl.float32)).to(PRODUCT_DTYPE).to(tl.float32)
        if GATED:
            z = tl.load(z_ptr + r * stride_z + c, mask=mask, other=0.0).to(tl.float32)
            y = y * (z / (1.0 + tl.exp(-z)))
    y = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + r * stride_y + c, y, mask=mask)
    if QUANT:
        store_row_codes(y.to(tl.float32), q_ptr, s_ptr, r, g, c, mask, rows, cols, rows_per_token, stride_sg,
                        BLOCK_R, GROUPS, GROUP, FP8_MAX)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as [rows, C] with a unit-stride last dim: a view when the leading dims collapse."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _output(out: torch.Tensor | None, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if out is None:
        return torch.empty(like.shape, dtype=dtype, device=like.device)
    if out.shape != like.shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {dtype} tensor of shape {tuple(like.shape)}")
    return out


def _launch(
    zero_centered: bool,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None,
    delta: torch.Tensor | None = None,
    h_out: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    quantise: bool = False,
    codes: tuple[torch.Tensor, torch.Tensor] | None = None,
    tile: tuple[int, int] | None = None,
) -> torch.Tensor | Activations:
    """codes: with quantise, the codes' rows and the scales' columns [groups, rows] to write (a run of
    a larger output's rows: gated_rms_norm_runs); then y is returned, not Activations. tile: (rows a
    program, warps) instead of the launcher's (benchmarks/bench_norm_codes.py)."""
    cols = x.shape[-1]
    if weight.shape != (cols,):
        raise ValueError(f"weight {tuple(weight.shape)} does not match rows of width {cols}")
    if quantise and not rows_split_into_groups(x.shape):
        raise ValueError(f"quantise: rows of {tuple(x.shape)} do not split into tokens' {GROUP}-groups")
    product_dtype = torch.promote_types(weight.dtype, x.dtype)
    plain = not zero_centered and z is None  # only the plain variant returns its product's dtype
    out = _output(out, x, product_dtype if plain else x.dtype)
    x2 = _rows(x)
    rows = x2.shape[0]
    features = math.prod(x.shape[1:]) if quantise else cols  # a token's, flattened
    tokens = x.shape[0] if quantise else rows
    q, s = codes or (quantised_outputs(tokens, features, ROWS_MULTIPLE, x.device) if quantise else (x2, x2))
    if rows:
        h2 = delta2 = z2 = x2  # stand-ins for the pointers the variant does not read
        if delta is not None:
            delta2, h2 = _rows(delta), h_out.view(-1, cols)
        if z is not None:
            z2 = _rows(z)
        y2 = out.view(-1, cols)
        block_c = triton.next_power_of_2(cols)
        block_r = max(1, _TILE // block_c)
        warps = 8 if block_r * block_c >= 4096 or quantise else 4
        block_r, warps = tile or (block_r, warps)
        group = min(block_c, GROUP)
        _rms_norm_kernel[(triton.cdiv(rows, block_r),)](
            x2, delta2, h2, z2, weight, y2, q, s,
            x2.stride(0), delta2.stride(0), h2.stride(0), z2.stride(0), y2.stride(0), s.stride(0),
            rows, cols, features // cols, eps,
            ONE_PLUS_W=zero_centered, GATED=z is not None, HAS_DELTA=delta is not None, QUANT=quantise,
            PRODUCT_DTYPE=TL_DTYPE[product_dtype], BLOCK_R=block_r, GROUPS=block_c // group, GROUP=group,
            FP8_MAX=FP8_MAX, num_warps=warps,
        )
    if not quantise or codes is not None:
        return out
    return Activations.quantised(out.view(tokens, features), q, s.t())


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool, out: torch.Tensor | None = None,
    quantise: bool = False, tile: tuple[int, int] | None = None,
) -> torch.Tensor | Activations:
    """RMSNorm over the last dim of x [..., C] with weight [C] (with its codes: Activations)."""
    return _launch(zero_centered, x, weight, eps, out, quantise=quantise, tile=tile)


def add_rms_norm(
    x: torch.Tensor,
    delta: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    zero_centered: bool,
    h_out: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    quantise: bool = False,
    tile: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | Activations]:
    """(h, norm(h)) for the residual sum h = x + delta, in one pass over the rows."""
    if delta.shape != x.shape or delta.dtype != x.dtype:
        raise ValueError(f"delta {delta.dtype}{tuple(delta.shape)} must match x {x.dtype}{tuple(x.shape)}")
    h_out = _output(h_out, x, x.dtype)
    y = _launch(zero_centered, x, weight, eps, out, delta=delta, h_out=h_out, quantise=quantise, tile=tile)
    return h_out, y


def gated_rms_norm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None,
    quantise: bool = False, tile: tuple[int, int] | None = None,
) -> torch.Tensor | Activations:
    """GDN's output norm: w · norm(x) · silu(z), rows of x and z [..., C] paired."""
    if z.shape != x.shape:
        raise ValueError(f"gate {tuple(z.shape)} must match x {tuple(x.shape)}")
    return _launch(False, x, weight, eps, out, z=z, quantise=quantise, tile=tile)


def gated_rms_norm_runs(
    runs: Sequence[tuple[torch.Tensor, int]], z: torch.Tensor, weight: torch.Tensor, eps: float,
    quantise: bool = False,
) -> torch.Tensor | Activations:
    """gated_rms_norm of an x [T, ...] given as runs of its rows (layers/row_pieces.py: (rows, first
    row)), each read where it lies: a launch a run, y (and its codes) written in place in one output,
    bit for bit one launch's over the assembled x (each row's arithmetic is its own)."""
    if len(runs) == 1 and runs[0][1] == 0:
        return gated_rms_norm(runs[0][0], z, weight, eps, quantise=quantise)
    y = torch.empty(z.shape, dtype=runs[0][0].dtype, device=z.device)
    tokens, features = z.shape[0], math.prod(z.shape[1:])
    q, s = quantised_outputs(tokens, features, ROWS_MULTIPLE, z.device) if quantise else (None, None)
    for rows, start in runs:
        end = start + rows.shape[0]
        if rows.shape[1:] != z.shape[1:] or rows.dtype != y.dtype or end > tokens:
            raise ValueError(f"run {rows.dtype}{tuple(rows.shape)} at row {start} does not fit the gate {tuple(z.shape)}")
        _launch(False, rows, weight, eps, y[start:end], z=z[start:end], quantise=quantise,
                codes=None if q is None else (q[start:end], s[:, start:end]))
    return Activations.quantised(y.view(tokens, features), q, s.t()) if quantise else y
