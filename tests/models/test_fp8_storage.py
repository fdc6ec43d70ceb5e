"""FP8 weights held as FP8 (the GPU layout), built and loaded on the CPU: the loader copies the
checkpoint's codes and block scales as they are, and they dequantise exactly to the weights the CPU
path holds; a BF16 tensor arriving for an FP8-held weight is quantised on the way in."""
from __future__ import annotations

from dataclasses import replace

import torch

from minisgl.engine.plan import BackendNames
from minisgl.layers.fp8 import FP8_DTYPE, dequantize_block_fp8, dequantize_gate_up, quantize_block_fp8
from minisgl.layers.fp8_linear import Fp8Linear
from minisgl.models.config import ModelConfig, QuantConfig, load_config
from minisgl.models.materialize import build_module, keeps_bf16
from minisgl.models.qwen3_5_moe import Qwen3_5MoeForCausalLM
from minisgl.models.weights import load_weights

CPU = torch.device("cpu")


def _model(config: ModelConfig, path: str, fp8: QuantConfig | None) -> torch.nn.Module:
    backends = BackendNames("torch", "torch", "torch").build()
    model = build_module(lambda: Qwen3_5MoeForCausalLM(config, backends), torch.float32, CPU, fp8)
    load_weights(model, path, config)
    return model


def _dequantised(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    out = {}
    for name, p in params.items():
        if name.endswith("_scale_inv"):
            continue
        if p.dtype == FP8_DTYPE:
            scale = params[name + "_scale_inv"]
            p = dequantize_gate_up(p, scale) if name.endswith("gate_up_proj") else dequantize_block_fp8(p, scale)
        out[name] = p.float()
    return out


def test_fp8_checkpoint_held_as_fp8_matches_the_dequantising_path(tiny_checkpoints: dict[str, str]) -> None:
    path = tiny_checkpoints["fp8"]
    config = load_config(path)
    held = _model(config, path, config.quant)
    ref = dict(_model(config, path, None).named_parameters())
    fp8 = {n for n, p in held.named_parameters() if p.dtype == FP8_DTYPE}
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in fp8)
    assert any(n.endswith("linear_attn.in_proj_qkv.weight") for n in fp8)
    assert not any(n.endswith(("mlp.gate.weight", "in_proj_a.weight", "lm_head.weight")) for n in fp8)
    assert isinstance(held.layers[3].self_attn.o_proj, Fp8Linear)
    for name, w in _dequantised(held).items():
        assert torch.equal(w, ref[name].float()), name


def test_bf16_tensors_are_quantised_into_fp8_held_weights(tiny_checkpoints: dict[str, str]) -> None:
    path = tiny_checkpoints["bf16"]
    quant = QuantConfig("fp8", (128, 128))
    config = replace(load_config(path), quant=quant)
    held = dict(_model(config, path, quant).named_parameters())
    ref = dict(_model(replace(config, quant=None), path, None).named_parameters())
    w = held["layers.0.linear_attn.in_proj_qkv.weight"]
    q, s = quantize_block_fp8(ref["layers.0.linear_attn.in_proj_qkv.weight"].data)
    assert w.dtype == FP8_DTYPE and torch.equal(w.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(held["layers.0.linear_attn.in_proj_qkv.weight_scale_inv"], s)


def test_modules_to_not_convert_keep_bf16_in_either_naming() -> None:
    quant = QuantConfig("fp8", (128, 128), ("model.language_model.layers.0.self_attn.o_proj", "layers.2.mlp.shared_expert.up_proj"))
    assert keeps_bf16("layers.0.self_attn.o_proj", quant)
    assert keeps_bf16("layers.2.mlp.shared_expert.up_proj", quant)
    assert keeps_bf16("layers.5.mlp.gate", quant) and keeps_bf16("lm_head", quant)
    assert not keeps_bf16("layers.1.self_attn.o_proj", quant)
    assert not keeps_bf16("layers.5.mlp.gate_proj", quant)
