"""The shared expert's fused SwiGLU + FP8 quantisation (kernels/swiglu_quant.py) against torch, bit for
bit: h against `F.silu(gate) * up` on the same stacked GEMM output, the codes and scales against
quantize_activations of torch's h (padded for cuBLAS as Activations.fp8 pads them), and the FP8
shared expert's output against its unfused path. No tolerance: the kernel rounds where torch rounds
(libdevice's expf, a correctly rounded division), so any difference is a bug."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp8_refs import random_fp8_moe_block
from kernel_checks import DEVICE

pytest.importorskip("triton")

from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE  # noqa: E402
from minisgl.kernels.fp8_quant import quantize_activations  # noqa: E402
from minisgl.kernels import swiglu_quant  # noqa: E402
from minisgl.kernels.activations import Activations  # noqa: E402
from minisgl.kernels.swiglu_quant import swiglu_codes, swiglu_quantised  # noqa: E402
from minisgl.layers.row_stack import layer_outputs  # noqa: E402

pytestmark = pytest.mark.gpu


def _gate_up(t: int, inter: int, dtype: torch.dtype) -> torch.Tensor:
    """A stacked gate/up output: per-token magnitudes, a zero row, and gates far past exp's range."""
    gu = torch.randn(t, 2 * inter, device=DEVICE) * torch.rand(t, 1, device=DEVICE).mul(4).add(0.1)
    if t > 2:
        gu[1] = 0.0  # a row whose groups are all zero: scale 1
        gu[2, : inter // 2] = -120.0  # exp(120) overflows fp32: silu is -0
        gu[2, inter // 2 : inter] = 120.0
    return gu.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("inter", [192, 1024])  # 192: a partial 128-group
@pytest.mark.parametrize("t", [1, 5, 37, 600])  # decode tiles below 512 tokens, prefill tiles from 512
def test_matches_torch_bit_for_bit(t: int, inter: int, dtype: torch.dtype) -> None:
    torch.manual_seed(t * inter)
    gu = _gate_up(t, inter, dtype)
    acts = swiglu_quantised(gu)
    ref_h = F.silu(gu[:, :inter]) * gu[:, inter:]
    assert acts.x.dtype == dtype and torch.equal(acts.x, ref_h)
    q, s = acts.fp8()
    ref_q, ref_s = quantize_activations(ref_h, ROWS_MULTIPLE)
    assert q.shape == ref_q.shape and s.shape == ref_s.shape  # padded rows as Activations.fp8 pads
    assert torch.equal(q[:t].view(torch.uint8), ref_q[:t].view(torch.uint8))
    assert torch.equal(s[:t], ref_s[:t])


@pytest.mark.parametrize("t", [5, 600])
def test_codes_alone_are_the_same_codes(t: int) -> None:
    """swiglu_codes (DeepGEMM's MoE path: h itself unwritten) gives swiglu_quantised's codes and scales."""
    torch.manual_seed(t)
    gu = _gate_up(t, 384, torch.bfloat16)
    q, s = swiglu_codes(gu)
    ref_q, ref_s = swiglu_quantised(gu).fp8()
    assert q.shape == ref_q.shape and s.shape == ref_s.shape and s.stride() == ref_s.stride()
    assert torch.equal(q[:t].view(torch.uint8), ref_q[:t].view(torch.uint8)) and torch.equal(s[:t], ref_s[:t])


def test_padding_rows_are_skipped_and_the_rest_unchanged() -> None:
    """With a grouped GEMM's row_expert, the real rows' codes and scales are swiglu_quantised's, and
    the padding rows, large here, are not read: their scales are the masked zeros' (1), not those of
    the large values that reading them gives."""
    torch.manual_seed(7)
    t = 640
    gu = _gate_up(t, 384, torch.bfloat16)
    row_expert = torch.randint(0, 4, (t,), dtype=torch.int32, device=DEVICE)
    row_expert[100:128] = -1
    row_expert[500:] = -1
    padding = row_expert < 0
    ref_q, ref_s = swiglu_quantised(gu).fp8()
    gu[padding] = 1000.0  # h = 1e6: scales ~2.2e3
    q, s = swiglu_codes(gu, row_expert)
    real = ~padding
    assert torch.equal(q[:t][real].view(torch.uint8), ref_q[:t][real].view(torch.uint8))
    assert torch.equal(s[:t][real], ref_s[:t][real])
    assert (s[:t][padding] == 1).all()  # an all-zero group's scale
    assert (swiglu_codes(gu)[1][:t][padding] > 1000).all()  # read, the rows give their own scales


def test_fast_rule_codes_hold_h_within_fp8_rounding() -> None:
    """Without torch's rounding (fp32 g * sigmoid(g) * u, fast exp and division), the dequantised
    codes are h, computed in fp64 from the same bf16 gate and up, within FP8's rounding: half a step
    of e4m3 (2^-4 of the value, normal; 2^-10 of the group's scale, subnormal) plus 2^-8 of the value
    for the fast exp and division. torch's rounding meets the same bound (its h rounds to bf16 first)."""
    torch.manual_seed(11)
    t, inter = 600, 384
    gu = _gate_up(t, inter, torch.bfloat16)
    g, u = gu[:, :inter].double(), gu[:, inter:].double()
    h = g * torch.sigmoid(g) * u
    for torch_rounding in (False, True):
        q, s = swiglu_codes(gu, torch_rounding=torch_rounding)
        scale = s[:t].repeat_interleave(128, dim=1)[:, :inter].double()
        deq = q[:t].double() * scale
        bound = h.abs() * (2**-4 + 2**-8) + scale * 2**-10
        assert ((deq - h).abs() <= bound).all(), torch_rounding


def test_leading_dims_are_kept() -> None:
    gu = _gate_up(12, 256, torch.bfloat16).view(3, 4, 512)
    acts = swiglu_quantised(gu)
    assert acts.x.shape == (3, 4, 256) and acts.fp8()[0].shape == (12, 256)


def test_fp8_shared_expert_matches_its_unfused_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gate and up stacked (256 rows each: whole 128-row blocks), down in FP8: the forward takes the
    fused kernel and gives what SwiGLU in torch and down's own quantisation give."""
    torch.manual_seed(3)
    block = random_fp8_moe_block(256, 4, 2, 128, 256)
    calls: list[int] = []

    def counted(gate_up: torch.Tensor) -> Activations:
        calls.append(gate_up.shape[0])
        return swiglu_quantised(gate_up)

    monkeypatch.setattr(swiglu_quant, "swiglu_quantised", counted)
    se = block.shared_expert
    assert se.gate_up is not None and se.gate_up.scale is not None, "the test needs a stacked FP8 gate/up"
    x = torch.randn(37, 256, device=DEVICE).to(torch.bfloat16)
    with torch.inference_mode():
        gate, up = layer_outputs(se.gate_up, (se.gate_proj, se.up_proj), x)
        assert torch.equal(se(x), se.down_proj(F.silu(gate) * up))
    assert calls == [37]
