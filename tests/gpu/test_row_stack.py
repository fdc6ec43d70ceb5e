"""The shared expert with its FP8 gate and up projections stacked in one storage (layers/row_stack.py):
one GEMM over the stack gives what the two layers give alone, on fresh random weights whose 128x128
block scales differ from block to block (a scale row of the stack read for the wrong layer's rows
moves outputs by the ratio of two scales, far past the bound).

Bound, as max |err| / max |ref|: 1e-2 (EMULATED of test_fp8_linear.py): the stack and the layers
run the same kernels on the same FP8 operands, but a GEMM over 2I rows may split K differently from
one over I, so fp32 sums differ in order and the bf16 outputs by a rounding.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from fp8_refs import DEVICE, rel_err
from minisgl.layers.fp8 import quantize_block_fp8
from minisgl.layers.fp8_linear import Fp8Linear
from minisgl.models.config import QuantConfig
from minisgl.models.materialize import build_module
from minisgl.moe.block import SharedExpert

pytestmark = pytest.mark.gpu

EMULATED = 1e-2
QUANT = QuantConfig("fp8", (128, 128))


def _fill(layer: Fp8Linear) -> None:
    n, k = layer.weight.shape
    w = torch.randn(n, k, device=DEVICE) / k**0.5
    w = w * torch.rand(n, 1, device=DEVICE).add(0.5) * torch.rand(1, k, device=DEVICE).add(0.5)
    codes, scale = quantize_block_fp8(w)
    layer.weight.copy_(codes)  # in place: the stacked layers' params are views of the stack
    layer.weight_scale_inv.copy_(scale)


@pytest.mark.parametrize("tokens", [1, 8, 40, 200, 600])
@pytest.mark.parametrize("hidden,intermediate", [(256, 256), (384, 512)])
def test_stacked_gate_up_matches_the_layers(tokens: int, hidden: int, intermediate: int) -> None:
    torch.manual_seed(tokens + hidden + intermediate)
    expert = build_module(lambda: SharedExpert(hidden, intermediate), torch.bfloat16, torch.device(DEVICE), QUANT)
    assert expert.gate_up is not None, "whole 128-row blocks: gate and up must be stacked"
    gate, up = expert.gate_proj, expert.up_proj
    assert gate.weight.data_ptr() == expert.gate_up.weight.data_ptr()
    assert up.weight.data_ptr() == expert.gate_up.weight[intermediate:].data_ptr()
    for layer in (gate, up, expert.down_proj):
        _fill(layer)
    x = torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16)
    ref = expert.down_proj(F.silu(gate(x)) * up(x))  # the two layers alone
    out = expert(x)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert rel_err(out, ref) <= EMULATED


def test_layers_not_of_whole_blocks_stay_apart() -> None:
    """Intermediate sizes that are not whole 128-row blocks (the tiny test models' 64) run gate and
    up as two GEMMs: a block scale of a stack would cover rows of both."""
    expert = build_module(lambda: SharedExpert(256, 64), torch.bfloat16, torch.device(DEVICE), QUANT)
    assert expert.gate_up is None
