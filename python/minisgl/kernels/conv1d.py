"""Causal depthwise conv1d + SiLU over pooled per-request conv state (GDN's short convolution).

The state of slot s holds the last W-1 pre-conv inputs, oldest first: conv_state[s, c, j], j < W-1.
Output for a token with input x: silu(sum_j w[c, j] * seq[j]) where seq = (state..., x) for decode.
Taps and state columns live in named scalars chosen by a KERNEL_WIDTH cascade (widths 2-4), so the
compiler keeps them in registers instead of an indexed local array.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernels.planar_out import PlanarOut
from minisgl.prefill_groups import PIECE_ALIGN

SUPPORTED_WIDTHS = (2, 3, 4)
# The L2 norm's epsilon inside the square root: the reference's (gdn/reference_math.py L2NORM_EPS).
_L2_EPS = tl.constexpr(1e-6)  # a jitted function reads only constexpr globals


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _out_columns(cols, stride_out, out_rows, split1, split2, channels, PLANAR: tl.constexpr):
    """(base, step) per column: out[row, col] lives at base[col] + row * step[col], in rows of
    stride_out or in PlanarOut's column blocks. Computed once per program, not per element."""
    if PLANAR:
        start = tl.where(cols >= split2, split2, tl.where(cols >= split1, split1, 0))
        end = tl.where(cols >= split2, channels, tl.where(cols >= split1, split2, split1))
        base = start.to(tl.int64) * out_rows + (cols - start)
        step = (end - start).to(tl.int64)
    else:
        base = cols.to(tl.int64)
        step = tl.zeros(cols.shape, tl.int64) + stride_out
    return base, step


# Per-step sizes must not specialise (a new compile after warm-up): the output's rows and first row.
@triton.jit(do_not_specialize=["out_rows", "row0"])
def _conv1d_update_kernel(
    x_ptr, w_ptr, state_ptr, slot_ptr, out_ptr,
    stride_x, stride_w, stride_slot, stride_c, stride_out, channels, out_rows, row0, split1, split2,
    KERNEL_WIDTH: tl.constexpr, BLOCK_C: tl.constexpr, PLANAR: tl.constexpr,
):
    row = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    cmask = cols < channels
    # Padding rows (slot 0) mask every state access off, so they move no state bytes.
    smask = cmask & (slot != 0)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
    w = w_ptr + cols * stride_w
    st = state_ptr + slot * stride_slot + cols * stride_c
    acc = x * tl.load(w + KERNEL_WIDTH - 1, mask=cmask, other=0.0).to(tl.float32)
    if KERNEL_WIDTH == 4:
        s0 = tl.load(st + 0, mask=smask, other=0.0)
        s1 = tl.load(st + 1, mask=smask, other=0.0)
        s2 = tl.load(st + 2, mask=smask, other=0.0)
        acc += s0.to(tl.float32) * tl.load(w + 0, mask=cmask, other=0.0).to(tl.float32)
        acc += s1.to(tl.float32) * tl.load(w + 1, mask=cmask, other=0.0).to(tl.float32)
        acc += s2.to(tl.float32) * tl.load(w + 2, mask=cmask, other=0.0).to(tl.float32)
        tl.store(st + 0, s1, mask=smask)
        tl.store(st + 1, s2, mask=smask)
        tl.store(st + 2, x.to(s0.dtype), mask=smask)
    elif KERNEL_WIDTH == 3:
        s0 = tl.load(st + 0, mask=smask, other=0.0)
        s1 = tl.load(st + 1, mask=smask, other=0.0)
        acc += s0.to(tl.float32) * tl.load(w + 0, mask=cmask, other=0.0).to(tl.float32)
        acc += s1.to(tl.float32) * tl.load(w + 1, mask=cmask, other=0.0).to(tl.float32)
        tl.store(st + 0, s1, mask=smask)
        tl.store(st + 1, x.to(s0.dtype), mask=smask)
    else:
        s0 = tl.load(st + 0, mask=smask, other=0.0)
        acc += s0.to(tl.float32) * tl.load(w + 0, mask=cmask, other=0.0).to(tl.float32)
        tl.store(st + 0, x.to(s0.dtype), mask=smask)
    y = tl.where(slot != 0, _silu(acc), 0.0)
    base, step = _out_columns(cols, stride_out, out_rows, split1, split2, channels, PLANAR)
    tl.store(out_ptr + base + (row0 + row.to(tl.int64)) * step, y.to(out_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _seq_value(x_ptr, state_col_ptr, start, p, stride_x, cols, cmask, smask, KERNEL_WIDTH: tl.constexpr):
    """Pre-conv input at position p of a request (a scalar): its token row when p >= 0, else the
    state column W-1+p. Masked loads, so only one of the two touches memory."""
    xv = tl.load(x_ptr + (start + p) * stride_x + cols, mask=cmask & (p >= 0), other=0.0)
    sv = tl.load(state_col_ptr + (p + KERNEL_WIDTH - 1), mask=smask & (p < 0), other=0.0)
    return xv.to(tl.float32) + sv.to(tl.float32)


@triton.jit
def _tap(w_ptr, cols, stride_w, cmask, j: tl.constexpr, KERNEL_WIDTH: tl.constexpr):
    """Weight of window position j in a width-4 window (oldest first): tap j - (4 - W) of the
    kernel, 0 before its first tap, so widths 2-4 share the four-tap arithmetic below."""
    w = tl.zeros(cols.shape, tl.float32)
    if j >= 4 - KERNEL_WIDTH:
        w = tl.load(w_ptr + cols * stride_w + (j - (4 - KERNEL_WIDTH)), mask=cmask, other=0.0).to(tl.float32)
    return w


@triton.jit
def _history(x_ptr, state_col_ptr, start, t0, stride_x, cols, cmask, smask, j: tl.constexpr,
             KERNEL_WIDTH: tl.constexpr):
    """Input at window position j (of 3) before token t0: position t0 - 3 + j, from the tokens or,
    before the request's first, from the state; 0 where the width has no such tap."""
    v = tl.zeros(cols.shape, tl.float32)
    if j >= 4 - KERNEL_WIDTH:
        v = _seq_value(x_ptr, state_col_ptr, start, t0 - 3 + j, stride_x, cols, cmask, smask, KERNEL_WIDTH)
    return v


@triton.jit
def _token(x_ptr, start, t, length, stride_x, cols, cmask):
    return tl.load(x_ptr + (start + t) * stride_x + cols, mask=cmask & (t < length), other=0.0).to(tl.float32)


@triton.jit
def _conv_out(out_ptr, base, step, row, y, live, cmask, cols, norm_channels, NORM_HEAD: tl.constexpr,
              BLOCK_C: tl.constexpr):
    """silu of the conv sum y, stored; with NORM_HEAD, channels below norm_channels (q and k) are
    L2-normalised over each head of NORM_HEAD channels (a head never straddles a block: NORM_HEAD
    divides BLOCK_C): in fp32 from the values rounded to the output's dtype, as a norm after the
    conv would read them, then rounded again."""
    y = _silu(y)
    if NORM_HEAD:
        if tl.program_id(0) * BLOCK_C < norm_channels:  # v's blocks skip the heads' sums
            y = y.to(out_ptr.dtype.element_ty).to(tl.float32)
            heads = tl.reshape(y, (BLOCK_C // NORM_HEAD, NORM_HEAD))
            inv = tl.rsqrt(tl.sum(heads * heads, axis=1) + _L2_EPS)
            y = tl.where(cols < norm_channels, tl.reshape(heads * inv[:, None], (BLOCK_C,)), y)
    tl.store(out_ptr + base + row * step, tl.where(live, y, 0.0).to(out_ptr.dtype.element_ty), mask=cmask)


# A program slides the conv window down BLOCK_T tokens of one request over BLOCK_C channels: each
# input is loaded and converted once, four rows at a time (loads first, then the four outputs).
# The [tokens, channels] tile form it replaced loaded every input once per tap and moved its tile
# through shared memory to store it: ~55 instructions an element, issue-bound at 0.29 of copy.
# ROW_MAP: token t's output row is row0 + row_ptr[t] (the GDN calls' order, prefill_groups.py); a
# block of BLOCK_T tokens never straddles two pieces (BLOCK_T divides PIECE_ALIGN), so one load a
# program gives its rows.
@triton.jit(do_not_specialize=["out_rows", "row0"])
def _conv1d_prefill_kernel(
    x_ptr, w_ptr, state_ptr, slot_ptr, cu_ptr, out_ptr, row_ptr,
    stride_x, stride_w, stride_slot, stride_c, stride_out, channels, out_rows, row0, split1, split2, norm_channels,
    KERNEL_WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, PLANAR: tl.constexpr,
    ROW_MAP: tl.constexpr, NORM_HEAD: tl.constexpr,
):
    block = tl.program_id(1)
    req = tl.program_id(2)
    start = tl.load(cu_ptr + req).to(tl.int64)
    length = tl.load(cu_ptr + req + 1).to(tl.int64) - start
    t0 = block * BLOCK_T
    if t0 >= length:  # past this request's end: the grid covers the longest request's tokens
        return
    slot = tl.load(slot_ptr + req).to(tl.int64)
    live = slot != 0
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < channels
    smask = cmask & live
    state_cols = state_ptr + slot * stride_slot + cols * stride_c
    wa = _tap(w_ptr, cols, stride_w, cmask, 0, KERNEL_WIDTH)
    wb = _tap(w_ptr, cols, stride_w, cmask, 1, KERNEL_WIDTH)
    wc = _tap(w_ptr, cols, stride_w, cmask, 2, KERNEL_WIDTH)
    wd = _tap(w_ptr, cols, stride_w, cmask, 3, KERNEL_WIDTH)
    # The window before t0 (only block 0 reaches into the state: t0 >= 3 elsewhere).
    a = _history(x_ptr, state_cols, start, t0, stride_x, cols, cmask, smask, 0, KERNEL_WIDTH)
    b = _history(x_ptr, state_cols, start, t0, stride_x, cols, cmask, smask, 1, KERNEL_WIDTH)
    c = _history(x_ptr, state_cols, start, t0, stride_x, cols, cmask, smask, 2, KERNEL_WIDTH)
    base, step = _out_columns(cols, stride_out, out_rows, split1, split2, channels, PLANAR)
    if ROW_MAP:
        out_row = row0 + tl.load(row_ptr + start + t0).to(tl.int64) - t0
    else:
        out_row = row0 + start
    for i in tl.static_range(0, BLOCK_T, 4):
        t = t0 + i
        x0 = _token(x_ptr, start, t, length, stride_x, cols, cmask)
        x1 = _token(x_ptr, start, t + 1, length, stride_x, cols, cmask)
        x2 = _token(x_ptr, start, t + 2, length, stride_x, cols, cmask)
        x3 = _token(x_ptr, start, t + 3, length, stride_x, cols, cmask)
        _conv_out(out_ptr, base, step, out_row + t, wa * a + wb * b + wc * c + wd * x0, live, cmask & (t < length),
                  cols, norm_channels, NORM_HEAD, BLOCK_C)
        _conv_out(out_ptr, base, step, out_row + t + 1, wa * b + wb * c + wc * x0 + wd * x1, live,
                  cmask & (t + 1 < length), cols, norm_channels, NORM_HEAD, BLOCK_C)
        _conv_out(out_ptr, base, step, out_row + t + 2, wa * c + wb * x0 + wc * x1 + wd * x2, live,
                  cmask & (t + 2 < length), cols, norm_channels, NORM_HEAD, BLOCK_C)
        _conv_out(out_ptr, base, step, out_row + t + 3, wa * x0 + wb * x1 + wc * x2 + wd * x3, live,
                  cmask & (t + 3 < length), cols, norm_channels, NORM_HEAD, BLOCK_C)
        a, b, c = x1, x2, x3

    # Only block 0 reads the old state (BLOCK_T >= W-1), so it alone writes the final state, after a
    # barrier that orders every thread's reads above before any write below.
    if block == 0:
        last = length - (KERNEL_WIDTH - 1)  # position of the oldest input the final window keeps
        f0 = _seq_value(x_ptr, state_cols, start, last, stride_x, cols, cmask, smask, KERNEL_WIDTH)
        if KERNEL_WIDTH >= 3:
            f1 = _seq_value(x_ptr, state_cols, start, last + 1, stride_x, cols, cmask, smask, KERNEL_WIDTH)
        if KERNEL_WIDTH >= 4:
            f2 = _seq_value(x_ptr, state_cols, start, last + 2, stride_x, cols, cmask, smask, KERNEL_WIDTH)
        tl.debug_barrier()
        dtype = state_ptr.dtype.element_ty
        tl.store(state_cols + 0, f0.to(dtype), mask=smask)
        if KERNEL_WIDTH >= 3:
            tl.store(state_cols + 1, f1.to(dtype), mask=smask)
        if KERNEL_WIDTH >= 4:
            tl.store(state_cols + 2, f2.to(dtype), mask=smask)


def _check(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor) -> int:
    width = weight.shape[1]
    if width not in SUPPORTED_WIDTHS:
        raise ValueError(f"conv kernel width {width} unsupported; supported: {SUPPORTED_WIDTHS}")
    if conv_state.shape[1:] != (x.shape[1], width - 1) or conv_state.stride(2) != 1:
        raise ValueError(f"conv_state {tuple(conv_state.shape)} does not match x {tuple(x.shape)} and width {width}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight need a contiguous channel/tap dimension")
    return width


def _out_args(x: torch.Tensor, out: torch.Tensor | PlanarOut) -> tuple:
    """(tensor, stride_out, out_rows, row0, split1, split2, PLANAR) for the kernels' output."""
    if isinstance(out, PlanarOut):
        if out.channels != x.shape[1] or out.row0 + x.shape[0] > out.rows or out.flat.dtype != x.dtype:
            raise ValueError(f"planar output of {out.rows} x {out.channels} {out.flat.dtype} from row {out.row0} "
                             f"cannot take x {tuple(x.shape)} {x.dtype}")
        return (out.flat, 0, out.rows, out.row0, *out.bounds, True)
    if out.shape != x.shape or out.stride(1) != 1:
        raise ValueError(f"out {tuple(out.shape)} must match x {tuple(x.shape)} with contiguous channels")
    return (out, out.stride(0), out.shape[0], 0, x.shape[1], x.shape[1], False)


def conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    out: torch.Tensor | PlanarOut | None = None,
    block_c: int = 256,
) -> torch.Tensor | PlanarOut:
    """x [B, C] (one token per request), weight [C, W], conv_state [S, C, W-1] -> [B, C] in x's dtype
    (or into a PlanarOut's rows from its row0). Shifts each slot's window by one in place; rows with
    slot 0 output zeros and touch no state."""
    width = _check(x, weight, conv_state)
    out = torch.empty_like(x) if out is None else out
    tensor, stride_out, out_rows, row0, split1, split2, planar = _out_args(x, out)
    batch, channels = x.shape
    grid = (triton.cdiv(channels, block_c), batch)
    _conv1d_update_kernel[grid](
        x, weight, conv_state, slots, tensor,
        x.stride(0), weight.stride(0), conv_state.stride(0), conv_state.stride(1), stride_out, channels,
        out_rows, row0, split1, split2,
        KERNEL_WIDTH=width, BLOCK_C=block_c, PLANAR=planar,
    )
    return out


def conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    out: torch.Tensor | PlanarOut | None = None,
    max_len: int | None = None,
    block_t: int = 32,
    block_c: int | None = None,
    num_warps: int = 4,
    row_map: torch.Tensor | None = None,
    qk_norm: tuple[int, int] | None = None,
) -> torch.Tensor | PlanarOut:
    """x [T, C] varlen over requests delimited by cu_seqlens [B+1]; each request starts from its slot's
    state and leaves its last W-1 inputs there (old history shifted in when it is shorter than W-1).
    Writes [T, C] in x's dtype, or a PlanarOut's rows from its row0; token t to row row_map[t]
    (int32) when given, a map that keeps the pieces of each request cut at PIECE_ALIGN consecutive
    (ForwardBatch.call_order's). Only its dtype and shape are checked: the kernel reads one row a
    block of block_t tokens, so another map writes wrong rows."""
    width = _check(x, weight, conv_state)
    if block_t % 4:
        raise ValueError(f"block_t={block_t} must be a multiple of 4 (the kernel steps four tokens at a time)")
    if row_map is not None and (PIECE_ALIGN % block_t or row_map.shape != (x.shape[0],) or row_map.dtype != torch.int32):
        raise ValueError(f"row_map must be int32 [{x.shape[0]}] and block_t={block_t} must divide {PIECE_ALIGN}, "
                         f"got {row_map.dtype} {tuple(row_map.shape)}")
    # 512 channels at 4 warps: the fastest of bench_gdn_attention.py's tilings at 16K tokens x
    # 12,288 channels on the H200 (0.72 of copy; 1024 and 2048 channels 0.62, 64 tokens 0.24-0.30).
    block_c = block_c or min(512, triton.next_power_of_2(x.shape[1]))
    norm_channels, norm_head = qk_norm or (0, 0)
    if qk_norm is not None and (norm_head < 1 or norm_channels % norm_head or block_c % norm_head
                                or norm_head & (norm_head - 1) or norm_channels > x.shape[1]):
        raise ValueError(f"qk_norm {qk_norm}: heads of a power-of-two size that divides {block_c} (the channel "
                         f"block) and the normalised channels, within the {x.shape[1]} channels")
    out = torch.empty_like(x) if out is None else out
    tensor, stride_out, rows, row0, split1, split2, planar = _out_args(x, out)
    channels = x.shape[1]
    batch = cu_seqlens.shape[0] - 1
    # Blocks past a request's end return at once. Without max_len (the longest request, a host
    # value the batch knows) the grid assumes any request could hold every token: reading it from
    # cu_seqlens would cost a host sync in every GDN layer.
    grid = (triton.cdiv(channels, block_c), triton.cdiv(max_len or x.shape[0], block_t), batch)
    _conv1d_prefill_kernel[grid](
        # Without a map the kernel never reads row_ptr: cu_seqlens stands in, an int32 pointer alike.
        x, weight, conv_state, slots, cu_seqlens, tensor, cu_seqlens if row_map is None else row_map,
        x.stride(0), weight.stride(0), conv_state.stride(0), conv_state.stride(1), stride_out, channels,
        rows, row0, split1, split2, norm_channels,
        KERNEL_WIDTH=width, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=num_warps, PLANAR=planar,
        ROW_MAP=row_map is not None, NORM_HEAD=norm_head,
    )
    return out
