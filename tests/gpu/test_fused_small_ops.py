"""Fused Triton RMSNorm variants and router top-k against their torch references, tiny and 122B shapes."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import DEVICE, poisoned

pytest.importorskip("triton")  # CPU-only installs collect these files and skip them

from minisgl.kernels.rms_norm import add_rms_norm, gated_rms_norm, rms_norm
from minisgl.kernels.router_topk import router_topk
from minisgl.layers.norm import GatedRMSNorm, RMSNorm, gated_rms_norm_torch, rms_norm_torch
from minisgl.moe.router import route, route_torch

pytestmark = pytest.mark.gpu

EPS = 1e-6
DTYPES = [torch.float32, torch.bfloat16]
# [rows, C]: a tiny odd width, no rows, and 122B's hidden; [T, heads, 256]: 122B's q (32) and k (2) norms.
ROW_SHAPES = [(3, 40), (0, 64), (7, 3072), (5, 32, 256), (5, 2, 256)]
# Allowed error in bf16 ulps at the reference's magnitude: one per bf16 rounding in the chain. The
# fp32 statistics differ from torch's in their last bits (reduction order, rsqrt, exp), which can
# flip a rounding by one ulp, and a flip early in the chain carries through the later roundings:
# zero-centered rounds once, plain twice (norm(x), then w·norm(x)), gated three times (then ·silu(z)).
ULPS = {"zero_centered": 1, "plain": 2, "gated": 3, "router": 1}
FP32_REL = 1e-5  # fp32 outputs differ by the reduction order only: a few fp32 ulps


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


def assert_matches(
    out: torch.Tensor, ref: torch.Tensor, ulps: int, what: str, rounded_to: torch.dtype | None = None
) -> None:
    """Per element: within `ulps` ulps, at ref's magnitude, of the narrowest dtype the computation
    rounds to (`rounded_to`, by default ref's dtype); FP32_REL relative when that is fp32."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, f"{what}: {out.dtype}{tuple(out.shape)}"
    assert not out.isnan().any(), f"{what}: NaN left in the output (an element was never written)"
    rounded_to = rounded_to or ref.dtype
    ref32 = ref.float()
    if rounded_to == torch.float32:
        allowed = FP32_REL * ref32.abs()
    else:
        eps = torch.full_like(ref32, torch.finfo(rounded_to).eps)  # the ulp of 1.0
        allowed = ulps * torch.ldexp(eps, torch.frexp(ref32)[1] - 1)
    excess = ((out.float() - ref32).abs() - allowed).max().item() if ref.numel() else 0.0
    assert excess <= 0, f"{what}: an element is {excess:.2e} past the allowed error"


def norm_weight(width: int, zero_centered: bool, dtype: torch.dtype) -> torch.Tensor:
    """Trained-like weights: near 0 for the 1 + w form, near 1 for the plain one."""
    return (torch.randn(width, device=DEVICE) * 0.2 + (0.0 if zero_centered else 1.0)).to(dtype)


def variant(zero_centered: bool) -> str:
    return "zero_centered" if zero_centered else "plain"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_rms_norm(shape: tuple[int, ...], zero_centered: bool, dtype: torch.dtype) -> None:
    x = torch.randn(shape, device=DEVICE).mul(3).to(dtype)
    w = norm_weight(shape[-1], zero_centered, dtype)
    out = rms_norm(x, w, EPS, zero_centered, out=poisoned(*shape, dtype=dtype))
    assert_matches(out, rms_norm_torch(x, w, EPS, zero_centered), ULPS[variant(zero_centered)], "rms_norm")


@pytest.mark.parametrize("zero_centered", [True, False])
def test_rms_norm_strided_rows(zero_centered: bool) -> None:
    """The q half of the gated q_proj ([T, 32, 2·256] split) is read in place through its row stride;
    a transposed input (no unit-stride last dim) goes through a copy."""
    w = norm_weight(256, zero_centered, torch.bfloat16)
    q = torch.randn(6, 32, 512, device=DEVICE, dtype=torch.bfloat16).split(256, dim=-1)[0]
    xt = torch.randn(256, 9, device=DEVICE, dtype=torch.bfloat16).t()
    for x in (q, xt):
        ref = rms_norm_torch(x, w, EPS, zero_centered)
        assert_matches(rms_norm(x, w, EPS, zero_centered), ref, ULPS[variant(zero_centered)], "strided rms_norm")


def test_rms_norm_fp32_weight_on_bf16_rows() -> None:
    """A plain fp32 weight makes the product fp32: no bf16 rounding after the multiply."""
    x = torch.randn(4, 3072, device=DEVICE, dtype=torch.bfloat16)
    w = norm_weight(3072, False, torch.float32)
    out = rms_norm(x, w, EPS, False, out=poisoned(4, 3072, dtype=torch.float32))
    ref = rms_norm_torch(x, w, EPS, False)
    # One bf16 rounding (norm(x)), but its flip, scaled by w, can span two ulps of the product's binade.
    assert_matches(out, ref, 2, "plain norm with an fp32 weight", rounded_to=torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("shape", [(3, 40), (0, 64), (7, 3072), (64, 3072)])
def test_add_rms_norm(shape: tuple[int, int], zero_centered: bool, dtype: torch.dtype) -> None:
    x = torch.randn(shape, device=DEVICE).mul(3).to(dtype)
    delta = torch.randn(shape, device=DEVICE).to(dtype)
    w = norm_weight(shape[-1], zero_centered, dtype)
    h, y = add_rms_norm(
        x, delta, w, EPS, zero_centered, h_out=poisoned(*shape, dtype=dtype), out=poisoned(*shape, dtype=dtype)
    )
    ref_h = x + delta
    assert torch.equal(h, ref_h), "the residual sum rounds once, as torch's add: exact"
    assert_matches(y, rms_norm_torch(ref_h, w, EPS, zero_centered), ULPS[variant(zero_centered)], "add + rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", [(6, 32), (0, 128), (8 * 64, 128)])  # tiny; 122B: 64 v-heads of 128
def test_gated_rms_norm(rows: int, width: int, dtype: torch.dtype) -> None:
    x = torch.randn(rows, width, device=DEVICE).mul(3).to(dtype)
    z = torch.randn(rows, width, device=DEVICE).mul(2).to(dtype)
    w = norm_weight(width, False, dtype)
    out = gated_rms_norm(x, z, w, EPS, out=poisoned(rows, width, dtype=dtype))
    assert_matches(out, gated_rms_norm_torch(x, z, w, EPS), ULPS["gated"], "gated rms_norm")


def distinct_logits(rows: int, experts: int, dtype: torch.dtype) -> torch.Tensor:
    """Random logits with no two equal in a row, even in bf16, so the top-k ids are unambiguous:
    a random permutation of k/32 (|k| <= 256 is exact in bf16), jittered below the spacing in fp32."""
    steps = torch.rand(rows, experts, device=DEVICE).argsort(dim=-1) - experts // 2
    logits = steps / 32
    if dtype == torch.float32:
        logits = logits + torch.rand(rows, experts, device=DEVICE) / 64
    return logits.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,experts,top_k,renormalize",
    # tiny; no rows; 122B (256 experts, top-8, renormalised); 512 experts top-10; 60 (not a power of
    # two); the largest k.
    [(5, 8, 2, False), (0, 8, 2, True), (64, 256, 8, True), (64, 512, 10, True), (64, 512, 10, False),
     (33, 60, 4, False), (9, 128, 16, True)],
)
def test_router_topk(rows: int, experts: int, top_k: int, renormalize: bool, dtype: torch.dtype) -> None:
    logits = distinct_logits(rows, experts, dtype)
    weights = poisoned(rows, top_k, dtype=dtype)
    ids = torch.full((rows, top_k), -1, dtype=torch.int64, device=DEVICE)
    router_topk(logits, top_k, renormalize, weights=weights, ids=ids)
    ref_w, ref_ids = route_torch(logits, top_k, renormalize)
    assert torch.equal(ids, ref_ids), "expert ids (and their order) must match torch.topk"
    assert_matches(weights, ref_w, ULPS["router"], "router weights")


def test_modules_dispatch_to_kernels() -> None:
    """On CUDA the modules run the kernels (bit-equal outputs), with the residual add fused."""
    x = torch.randn(5, 3072, device=DEVICE, dtype=torch.bfloat16)
    delta = torch.randn(5, 3072, device=DEVICE, dtype=torch.bfloat16)
    norm = RMSNorm(3072, EPS, zero_centered=True).to(DEVICE)
    norm.weight.data = norm_weight(3072, True, torch.bfloat16)
    assert torch.equal(norm(x), rms_norm(x, norm.weight, EPS, True))
    h, y = norm.add_and_norm(x, delta)
    ref_h, ref_y = add_rms_norm(x, delta, norm.weight, EPS, True)
    assert torch.equal(h, ref_h) and torch.equal(y, ref_y)

    gated = GatedRMSNorm(128, EPS).to(DEVICE)
    gated.weight.data = norm_weight(128, False, torch.bfloat16)
    o, z = x.view(-1, 128), delta.view(-1, 128)
    assert torch.equal(gated(o, z), gated_rms_norm(o, z, gated.weight, EPS))

    logits = distinct_logits(7, 256, torch.bfloat16)
    w, ids = route(logits, 8, True)
    ref_w, ref_ids = router_topk(logits, 8, True)
    assert torch.equal(w, ref_w) and torch.equal(ids, ref_ids)
