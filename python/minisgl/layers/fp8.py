"""Block-wise FP8 (e4m3) weight quantisation in the layout of the official FP8 checkpoints.

A weight W [out, in] is stored as Wq (float8_e4m3fn) plus `weight_scale_inv` s of shape
[ceil(out/b0), ceil(in/b1)], with W[i, j] = Wq[i, j] * s[i // b0, j // b1]. Leading batch
dimensions (e.g. stacked experts) are carried through unchanged.
"""
from __future__ import annotations

import torch

from minisgl.kernels.fp8_format import FP8_DTYPE, FP8_MAX


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _expected_scale_shape(shape: torch.Size, block: tuple[int, int]) -> tuple[int, ...]:
    return (*shape[:-2], cdiv(shape[-2], block[0]), cdiv(shape[-1], block[1]))


def _expand_scale(scale: torch.Tensor, rows: int, cols: int, block: tuple[int, int]) -> torch.Tensor:
    """Broadcast a per-block scale to per-element, cropping the padding of partial edge blocks."""
    full = scale.repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    return full[..., :rows, :cols]


def quantize_block_fp8(
    w: torch.Tensor, block: tuple[int, int] = (128, 128)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise w [..., out, in] to float8_e4m3fn plus a float32 scale_inv holding one value per block."""
    if w.dim() < 2:
        raise ValueError(f"quantize_block_fp8 needs a tensor with >= 2 dims, got shape {tuple(w.shape)}")
    rows, cols = w.shape[-2:]
    b0, b1 = block
    nb0, nb1 = cdiv(rows, b0), cdiv(cols, b1)
    wf = w.to(torch.float32)
    # Zero padding never raises a block's amax, so edge blocks scale by their real elements only.
    padded = torch.nn.functional.pad(wf, (0, nb1 * b1 - cols, 0, nb0 * b0 - rows))
    blocks = padded.reshape(*w.shape[:-2], nb0, b0, nb1, b1)
    amax = blocks.abs().amax(dim=(-3, -1))
    # An all-zero block would give scale 0 and 0/0 = NaN; any positive scale encodes zeros exactly.
    # A tensor divisor: CUDA torch turns division by a Python scalar into a product with its
    # reciprocal, which rounds differently; a true division gives the same scales on every device.
    scale_inv = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    q = (wf / _expand_scale(scale_inv, rows, cols, block)).clamp(-FP8_MAX, FP8_MAX)
    return q.to(FP8_DTYPE), scale_inv


def dequantize_block_fp8(
    wq: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int] = (128, 128),
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of quantize_block_fp8: W[i, j] = Wq[i, j] * s[i // b0, j // b1], returned in `dtype`."""
    if wq.dim() < 2:
        raise ValueError(f"dequantize_block_fp8 needs a tensor with >= 2 dims, got shape {tuple(wq.shape)}")
    expected = _expected_scale_shape(wq.shape, block)
    if tuple(scale_inv.shape) != expected:
        raise ValueError(
            f"weight_scale_inv shape {tuple(scale_inv.shape)} does not match weight shape "
            f"{tuple(wq.shape)} with block {tuple(block)}: expected {expected} "
            f"(ceil(out/{block[0]}), ceil(in/{block[1]}))"
        )
    rows, cols = wq.shape[-2:]
    scale = _expand_scale(scale_inv.to(torch.float32), rows, cols, block)
    return (wq.to(torch.float32) * scale).to(dtype)


def quantize_gate_up(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_block_fp8 of a fused [..., 2I, H] gate_up weight, its gate and up halves quantised as
    separate matrices (the on-disk FP8 layout; see dequantize_gate_up)."""
    inter = w.shape[-2] // 2
    (gq, gs), (uq, us) = quantize_block_fp8(w[..., :inter, :], block), quantize_block_fp8(w[..., inter:, :], block)
    return torch.cat([gq, uq], dim=-2), torch.cat([gs, us], dim=-2)


def dequantize_gate_up(
    wq: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128), dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantise a fused [..., 2I, H] gate_up weight whose gate and up halves were quantised as the
    two separate matrices they are on disk: scale_inv is [..., 2 * ceil(I/b0), ceil(H/b1)], gate's
    block rows first."""
    inter = wq.shape[-2] // 2
    nb = cdiv(inter, block[0])
    gate = dequantize_block_fp8(wq[..., :inter, :], scale_inv[..., :nb, :], block, dtype)
    up = dequantize_block_fp8(wq[..., inter:, :], scale_inv[..., nb:, :], block, dtype)
    return torch.cat([gate, up], dim=-2)
