"""The block-scaled FP8 GEMM (kernels/fp8_gemm.py, layers/fp8_linear.py) against torch on fresh
random inputs, output memory poisoned with NaN first.

Tolerances, as max |err| / max |ref|:
- EMULATED 1e-2 against torch on the same FP8 operands (activations quantised by the same rule,
  bit for bit: see test_activation_quantiser_is_bit_exact): only the fp32 summation order and the
  bf16 output rounding (2^-9 relative) differ.
- PLAIN 6e-2 against bf16 activations on the dequantised weights: e4m3 keeps 3 mantissa bits, so
  each quantised activation is off by up to 2^-4 relative (about 2.5% rms); a K-term dot product
  of random terms carries that same relative rms error, and its max over all outputs stays near
  3-4% of the max output.
"""
from __future__ import annotations

import pytest
import torch

from fp8_refs import DEVICE, emulated_linear, plain_linear, poison_allocator, rel_err

pytest.importorskip("triton")

from minisgl.kernels.fp8_gemm import fp8_linear
from minisgl.kernels.fp8_quant import quantize_activations
from minisgl.layers.fp8 import FP8_DTYPE, quantize_block_fp8
from minisgl.layers.fp8_linear import Fp8Linear

pytestmark = pytest.mark.gpu

EMULATED = 1e-2
PLAIN = 6e-2
# (N, K): 122B in_proj_qkv, GDN/attention out_proj, shared-expert gate; ragged edges; tiny-model sizes.
SHAPES = [(12288, 3072), (3072, 8192), (1024, 3072), (200, 320), (96, 64)]


def _weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random FP8 weight whose 128x128 block scales differ from block to block."""
    w = torch.randn(n, k, device=DEVICE) / k**0.5
    w = w * torch.rand(n, 1, device=DEVICE).add(0.5) * torch.rand(1, k, device=DEVICE).add(0.5)
    return quantize_block_fp8(w)


@pytest.mark.parametrize("m,k", [(1, 3072), (64, 8192), (37, 320), (5, 64)])
def test_activation_quantiser_is_bit_exact(m: int, k: int) -> None:
    """Same codes and scales as layers/fp8.quantize_block_fp8 with block (1, 128), the reference rule."""
    torch.manual_seed(m + k)
    x = (torch.randn(m, k, device=DEVICE) * torch.rand(m, 1, device=DEVICE).mul(8)).to(torch.bfloat16)
    x[m // 2, : k // 2] = 0  # an all-zero group (padding) scales by 1
    poison_allocator()
    q, s = quantize_activations(x)
    ref_q, ref_s = quantize_block_fp8(x.float(), (1, 128))
    assert torch.equal(s, ref_s)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 7, 64, 300])
def test_fp8_linear_matches_torch(n: int, k: int, m: int) -> None:
    torch.manual_seed(n * 7 + k * 3 + m)
    w, s = _weight(n, k)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=DEVICE)
    poison_allocator()
    out = fp8_linear(x, w, s)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert rel_err(out, emulated_linear(x, w, s)) <= EMULATED
    assert rel_err(out, plain_linear(x, w, s)) <= PLAIN


@pytest.mark.parametrize("block_n", [16, 32, 64, 128])
def test_every_weight_tile_width_agrees(block_n: int) -> None:
    torch.manual_seed(block_n)
    w, s = _weight(640, 384)
    x = torch.randn(40, 384, dtype=torch.bfloat16, device=DEVICE)
    poison_allocator()
    assert rel_err(fp8_linear(x, w, s, block_n=block_n), emulated_linear(x, w, s)) <= EMULATED


@pytest.mark.parametrize("split_k", [1, 2, 3, 8])
def test_every_k_split_agrees(split_k: int) -> None:
    torch.manual_seed(split_k)
    w, s = _weight(384, 1280)  # 10 K steps: uneven splits, and more splits than steps
    x = torch.randn(9, 1280, dtype=torch.bfloat16, device=DEVICE)
    poison_allocator()
    assert rel_err(fp8_linear(x, w, s, split_k=split_k), emulated_linear(x, w, s)) <= EMULATED


def test_module_takes_batched_input_and_zero_rows() -> None:
    torch.manual_seed(1)
    w, s = _weight(256, 512)
    layer = Fp8Linear(512, 256).to(DEVICE)
    assert layer.weight.dtype == FP8_DTYPE
    layer.weight.data.copy_(w)
    layer.weight_scale_inv.data.copy_(s)
    x = torch.randn(2, 5, 512, dtype=torch.bfloat16, device=DEVICE)
    x[1, 2] = 0  # an all-zero token (padding) must give zeros, not 0/0
    out = layer(x)
    assert out.shape == (2, 5, 256)
    assert rel_err(out.view(10, 256), emulated_linear(x.view(10, 512), w, s)) <= EMULATED
    assert torch.equal(out[1, 2], torch.zeros_like(out[1, 2]))
