"""Full attention's fused glue against the torch path it replaces: per-head q/k RMSNorm + partial RoPE
(kernels/qk_norm_rope.py) and the sigmoid output gate (kernels/sigmoid_gate.py, with o_proj's FP8
codes or without), tiny and 122B shapes."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import DEVICE, poisoned

pytest.importorskip("triton")  # CPU-only installs collect these files and skip them

from minisgl.kernels.activations import Activations
from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE
from minisgl.kernels.fp8_quant import quantize_activations
from minisgl.kernels.qk_norm_rope import norm_rope
from minisgl.kernels.sigmoid_gate import sigmoid_gate
from minisgl.layers.norm import RMSNorm, rms_norm_torch
from minisgl.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.gpu

EPS = 1e-6
THETA = 1e7
DTYPES = [torch.float32, torch.bfloat16]
# (T, heads, head_dim, rotary_dim, gated): 122B's q (32 heads read from [T, 32, 2·256]) and k (2),
# a TP shard's single KV head, the tiny model's q, a width that is not a power of two, no tokens.
SHAPES = [(37, 32, 256, 64, True), (37, 2, 256, 64, False), (9, 1, 256, 64, False), (5, 4, 64, 16, True),
          (3, 3, 40, 10, True), (0, 32, 256, 64, True)]
# Allowed error in bf16 ulps at the magnitude m = max(|norm(x)|, |rotate_half(norm(x))|) of the
# element's inputs. The chain is torch's op for op, so the only source of difference is the fp32 norm
# statistics (reduction order, rsqrt) flipping a rounding of norm(x) by one ulp (two for the plain
# norm, which rounds twice). On a rotary column that flip enters a = y·cos and b = rotate_half(y)·sin
# (|cos|, |sin| <= 1), each of which may then round one ulp the other way, and a + b rounds once more
# at up to 2m: 2·flip + 2 + 2 ulps of m at most.
NORM_ULPS = {True: 1, False: 2}
FP32_REL = 1e-5  # of m: fp32 differs by reduction order and (on the GPU) fused multiply-adds only
# Reproducing the rounding chain is checked directly: nearly every bf16 rotary element is bit-equal.
# (A flip needs the fp32 statistics within ~1e-7 of a rounding boundary; rounding a + b once in fp32
# instead of after each op misses on about 30% of the rotary columns.)
MIN_EXACT = 0.99


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


def ulp(m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ulp of `dtype` at magnitude m (fp32 tensor)."""
    return torch.ldexp(torch.full_like(m, torch.finfo(dtype).eps), torch.frexp(m)[1] - 1)


def rotate_half(y: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """[-y[h:r], y[:h], y[r:]] with h = r/2: each element's rotation partner (itself past rotary_dim)."""
    half = rotary_dim // 2
    return torch.cat([-y[..., half:rotary_dim], y[..., :half], y[..., rotary_dim:]], dim=-1)


def q_and_gate(t: int, heads: int, d: int, gated: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Strided [T, heads, d] views of a q_proj output: [query | gate] per head when gated."""
    proj = torch.randn(t, heads, d * (2 if gated else 1), device=DEVICE).mul(3).to(dtype)
    return proj[..., :d], (proj[..., d:] if gated else torch.randn(t, heads, d, device=DEVICE).to(dtype))


def random_cos_sin(t: int, rotary_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables for random positions (not 0..T), as the model makes them."""
    positions = torch.randint(0, 1 << 18, (t,), device=DEVICE)
    return RotaryEmbedding(rotary_dim, THETA).cos_sin(positions, dtype)


def norm_weight(d: int, zero_centered: bool, dtype: torch.dtype) -> torch.Tensor:
    """Trained-like weights: near 0 for the 1 + w form, near 1 for the plain one."""
    return (torch.randn(d, device=DEVICE) * 0.2 + (0.0 if zero_centered else 1.0)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("t,heads,d,rotary_dim,gated", SHAPES)
def test_norm_rope(
    t: int, heads: int, d: int, rotary_dim: int, gated: bool, zero_centered: bool, dtype: torch.dtype
) -> None:
    x, _ = q_and_gate(t, heads, d, gated, dtype)
    w = norm_weight(d, zero_centered, dtype)
    cos, sin = random_cos_sin(t, rotary_dim, dtype)
    out = norm_rope(x, w, cos, sin, EPS, zero_centered, rotary_dim, out=poisoned(t, heads, d, dtype=dtype))

    y = rms_norm_torch(x, w, EPS, zero_centered)
    ref = RotaryEmbedding(rotary_dim, THETA).apply(y, cos, sin)
    assert out.shape == ref.shape and out.dtype == ref.dtype and not out.isnan().any()
    m = torch.maximum(y.float().abs(), rotate_half(y, rotary_dim).float().abs())
    if dtype == torch.float32:
        allowed = FP32_REL * m
    else:
        rotary = torch.arange(d, device=DEVICE) < rotary_dim
        ulps = torch.where(rotary, 2 * NORM_ULPS[zero_centered] + 4, NORM_ULPS[zero_centered])
        allowed = ulps * ulp(m, dtype)
        if t:
            exact = (out == ref)[..., :rotary_dim].float().mean().item()
            assert exact >= MIN_EXACT, f"only {exact:.3f} of the rotary elements are bit-equal to torch's chain"
    excess = ((out.float() - ref.float()).abs() - allowed).max().item() if t else 0.0
    assert excess <= 0, f"an element is {excess:.2e} past the allowed error"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,heads,d", [(37, 32, 256), (5, 4, 64), (3, 3, 40), (0, 32, 256)])
def test_sigmoid_gate(t: int, heads: int, d: int, dtype: torch.dtype) -> None:
    o = torch.randn(t, heads, d, device=DEVICE).to(dtype)
    _, gate = q_and_gate(t, heads, d, True, dtype)
    out = sigmoid_gate(o, gate, out=poisoned(t, heads, d, dtype=dtype))
    ref = (o.flatten(1) * torch.sigmoid(gate.flatten(1))).view(t, heads, d)
    assert out.shape == ref.shape and out.dtype == ref.dtype and not out.isnan().any()
    if dtype == torch.float32:
        allowed = FP32_REL * ref.float().abs()  # a product: no cancellation, relative error holds
    else:
        # A one-ulp flip of sigmoid's bf16 rounding (exp's last bits) moves o·s by at most one ulp of
        # s relative (2^-7), i.e. up to two ulps at |ref|, and the product may round one more.
        allowed = 3 * ulp(ref.float().abs(), dtype)
        if t:
            exact = (out == ref).float().mean().item()
            assert exact >= MIN_EXACT, f"only {exact:.3f} of the gated elements are bit-equal to torch's"
    excess = ((out.float() - ref.float()).abs() - allowed).max().item() if t else 0.0
    assert excess <= 0, f"an element is {excess:.2e} past the allowed error"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,heads,d", [(37, 32, 256), (6, 3, 128), (0, 32, 256)])
def test_sigmoid_gate_codes(t: int, heads: int, d: int, dtype: torch.dtype) -> None:
    """With quantise the gate returns its y bit for bit as without (each element's arithmetic is its
    own), as [T, heads · d], with the quantiser's codes and scales of that y (o_proj's input)."""
    o = torch.randn(t, heads, d, device=DEVICE).to(dtype)
    if t > 2:
        o[1] = 0.0  # a token of zeros: its groups' scale is 1
    _, gate = q_and_gate(t, heads, d, True, dtype)
    acts = sigmoid_gate(o, gate, quantise=True)
    assert isinstance(acts, Activations) and acts.x.shape == (t, heads * d)
    assert torch.equal(acts.x, sigmoid_gate(o, gate).flatten(1))
    q, s = acts.fp8()
    ref_q, ref_s = quantize_activations(acts.x, ROWS_MULTIPLE)
    assert q.shape == ref_q.shape and s.shape == ref_s.shape and s.stride() == ref_s.stride()
    assert torch.equal(q[:t].view(torch.uint8), ref_q[:t].view(torch.uint8)) and torch.equal(s[:t], ref_s[:t])


def test_sigmoid_gate_codes_need_whole_groups() -> None:
    o = torch.randn(3, 4, 64, device=DEVICE)
    with pytest.raises(ValueError, match="128-groups"):
        sigmoid_gate(o, o.clone(), quantise=True)


def test_apply_normed_dispatches_to_the_kernel() -> None:
    """On CUDA, RotaryEmbedding.apply_normed is the fused kernel, bit for bit."""
    if DEVICE != "cuda":
        pytest.skip("the dispatch is on CUDA tensors")
    x, _ = q_and_gate(7, 32, 256, True, torch.bfloat16)
    norm = RMSNorm(256, EPS, zero_centered=True).to(DEVICE)
    norm.weight.data = norm_weight(256, True, torch.bfloat16)
    rotary = RotaryEmbedding(64, THETA)
    cos, sin = random_cos_sin(7, 64, torch.bfloat16)
    assert torch.equal(rotary.apply_normed(x, norm, cos, sin), norm_rope(x, norm.weight, cos, sin, EPS, True, 64))
