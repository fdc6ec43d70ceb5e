"""Block-128 FP8 helpers: round trip accuracy, block independence, scale-shape validation."""
from __future__ import annotations

import pytest
import torch

from minisgl.layers.fp8 import dequantize_block_fp8, quantize_block_fp8

# e4m3 has 3 mantissa bits, so round-to-nearest of a normal value errs by at most half a step:
# |err| <= 2^-4 * |w|. Values far below their block's amax fall into the subnormal range of the
# scaled domain (|w/s| < 2^-6), where the step is 2^-9 * s, i.e. |err| <= 2^-10 * s.
REL_STEP = 2.0**-4
SUBNORMAL_ABS = 2.0**-10


def _random(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g).add(0.1)


def _per_element_scale(s: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return s.repeat_interleave(128, 0).repeat_interleave(128, 1)[: shape[0], : shape[1]]


def test_round_trip_non_aligned() -> None:
    w = _random(300, 200)
    wq, s = quantize_block_fp8(w)
    assert wq.dtype == torch.float8_e4m3fn and wq.shape == w.shape
    assert s.dtype == torch.float32 and s.shape == (3, 2)
    w2 = dequantize_block_fp8(wq, s)
    assert w2.dtype == torch.float32
    err = (w2 - w).abs()
    bound = REL_STEP * w.abs() + SUBNORMAL_ABS * _per_element_scale(s, w.shape) + 1e-12
    assert bool((err <= bound).all()), float((err / bound).max())
    # Rounding errors are spread over [0, half a step], so the aggregate error is well below the max.
    assert float(err.norm() / w.norm()) < 0.04
    # Each block's largest element maps exactly onto +-448 * scale.
    for bi in range(3):
        for bj in range(2):
            blk = w[bi * 128 : (bi + 1) * 128, bj * 128 : (bj + 1) * 128]
            assert torch.allclose(s[bi, bj], blk.abs().max() / 448.0)


def test_bf16_input_and_output_dtype() -> None:
    w = _random(130, 257, seed=1).to(torch.bfloat16)
    wq, s = quantize_block_fp8(w)
    assert s.shape == (2, 3)
    w2 = dequantize_block_fp8(wq, s, dtype=torch.bfloat16)
    assert w2.dtype == torch.bfloat16
    rel = (w2.float() - w.float()).norm() / w.float().norm()
    assert float(rel) < 0.04


def test_blocks_are_independent() -> None:
    w = _random(300, 200, seed=2)
    wq, s = quantize_block_fp8(w)
    w_big = w.clone()
    w_big[128:256, 0:128] *= 1000.0
    wq_big, s_big = quantize_block_fp8(w_big)
    assert torch.allclose(s_big[1, 0], s[1, 0] * 1000.0, rtol=1e-6)
    mask = torch.ones(3, 2, dtype=torch.bool)
    mask[1, 0] = False
    assert torch.equal(s_big[mask], s[mask])
    elem_mask = _per_element_scale(mask.float(), w.shape).bool()
    assert torch.equal(wq_big.view(torch.uint8)[elem_mask], wq.view(torch.uint8)[elem_mask])
    # Only the scaled block's scale moves; its fp8 codes match (exact for this seed, float32
    # rounding of w / s could in principle flip a code that sits on a rounding tie).
    blk = slice(128, 256), slice(0, 128)
    assert torch.equal(wq_big.view(torch.uint8)[blk], wq.view(torch.uint8)[blk])


def test_zero_block_is_exact() -> None:
    w = _random(256, 128, seed=3)
    w[:128] = 0.0
    wq, s = quantize_block_fp8(w)
    assert torch.isfinite(s).all() and bool((s > 0).all())
    w2 = dequantize_block_fp8(wq, s)
    assert bool((w2[:128] == 0).all())


def test_scale_shape_mismatch_raises() -> None:
    wq, s = quantize_block_fp8(_random(300, 200, seed=4))
    with pytest.raises(ValueError, match=r"expected \(3, 2\)"):
        dequantize_block_fp8(wq, s[:2])
    with pytest.raises(ValueError, match="does not match"):
        dequantize_block_fp8(wq, s.t())
    with pytest.raises(ValueError, match="expected"):
        dequantize_block_fp8(wq, s, block=(64, 64))
