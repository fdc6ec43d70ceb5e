"""Layers stacked in one storage (layers/row_stack.py) give what the layers give alone: the shared
expert's FP8 gate and up on fresh random weights whose 128x128 block scales differ from block to
block (a scale row of the stack read for the wrong layer's rows moves outputs by the ratio of two
scales, far past the bound); and a model's mixers, attention's FP8 q, k and v and GDN's BF16 b and
a, whose outputs are strided column blocks of one tensor that the kernels after them read in place.

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


def _logits(engine: object, prompts: list[list[int]]) -> torch.Tensor:
    """Last-token logits of a prefill step over fresh slots (the GDN states start from zero), then of
    a decode step after it (the decode kernels read the stacked b and a too)."""
    slots = [engine.pool.allocate(len(p) + 1) for p in prompts]
    for slot, p in zip(slots, prompts):
        engine.pool.ensure_tokens(slot, len(p) + 1)
    prefill = engine.forward_batch(engine.make_batch(prompts, [0] * len(prompts), slots)).float()
    nxt = [[int(t)] for t in prefill.argmax(-1)]
    decode = engine.forward_batch(engine.make_batch(nxt, [len(p) for p in prompts], slots)).float()
    for slot in slots:
        engine.pool.free(slot)
    return torch.cat([prefill, decode])


def test_stacked_mixer_projections_match_the_layers(tiny_checkpoints: dict[str, str]) -> None:
    from minisgl import LLM

    torch.manual_seed(7)
    with LLM(tiny_checkpoints["fp8"], device="cuda", dtype="bfloat16", page_size=16, context_length=256,
             max_running_requests=4, disable_cuda_graph=True) as llm:
        engine = llm.engine
        attention = [layer.self_attn for layer in engine.model.layers if hasattr(layer, "self_attn")]
        gdn = [layer.linear_attn for layer in engine.model.layers if hasattr(layer, "linear_attn")]
        assert all(a.qkv is not None for a in attention) and all(g.gates is not None for g in gdn)
        prompts = [torch.randint(3, 400, (n,)).tolist() for n in (37, 5, 90)]
        stacked = _logits(engine, prompts)
        for a in attention:
            a.qkv = None
        for g in gdn:
            g.gates = None
        alone = _logits(engine, prompts)
    assert torch.isfinite(stacked).all() and rel_err(stacked, alone) <= EMULATED


def test_layers_not_of_whole_blocks_stay_apart() -> None:
    """Intermediate sizes that are not whole 128-row blocks (the tiny test models' 64) run gate and
    up as two GEMMs: a block scale of a stack would cover rows of both."""
    expert = build_module(lambda: SharedExpert(256, 64), torch.bfloat16, torch.device(DEVICE), QUANT)
    assert expert.gate_up is None
