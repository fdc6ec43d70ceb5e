"""Load a checkpoint into the transformers reference model without any minisgl code.

The state dict is rebuilt here by hand (prefix mapping, expert fusion, FP8 dequantisation) so that a
bug in minisgl's loader or FP8 helpers cannot cancel out in an engine-vs-reference comparison.
transformers' own from_pretrained works for the bf16 layouts but needs accelerate (and a GPU
kernel path) for FP8, so one manual path serves both.
"""
from __future__ import annotations

import json
import os
import re
from collections import defaultdict

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, Qwen3_5MoeForCausalLM, Qwen3MoeForCausalLM

_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def _read_safetensors(ckpt_dir: str) -> dict[str, torch.Tensor]:
    index = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    sd: dict[str, torch.Tensor] = {}
    for name in files:
        sd.update(load_file(os.path.join(ckpt_dir, name)))
    return sd


def _dequantize(sd: dict[str, torch.Tensor], block: tuple[int, int]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if name.endswith("_scale_inv"):
            continue
        scale = sd.get(f"{name}_scale_inv")
        if scale is not None:
            rows, cols = t.shape
            s = scale.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:rows, :cols]
            t = t.float() * s
        out[name] = t
    return out


def _fuse_experts(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert gate/up/down -> HF's fused gate_up_proj [E, 2I, H] (gate first) and down_proj [E, H, I]."""
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = defaultdict(lambda: defaultdict(dict))
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        m = _EXPERT.match(name)
        if m:
            groups[m.group(1)][int(m.group(2))][m.group(3)] = t
        else:
            out[name] = t
    for prefix, experts in groups.items():
        ids = sorted(experts)
        assert ids == list(range(len(ids))), f"{prefix}: expert ids {ids} are not 0..E-1"
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate"], experts[e]["up"]], 0) for e in ids]
        )
        out[f"{prefix}.down_proj"] = torch.stack([experts[e]["down"] for e in ids])
    return out


def load_hf_reference(ckpt_dir: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """transformers' Qwen3_5MoeForCausalLM / Qwen3MoeForCausalLM with ckpt_dir's weights, in eval mode."""
    config = AutoConfig.from_pretrained(ckpt_dir)
    quant = getattr(config, "quantization_config", None)
    if config.model_type == "qwen3_5_moe":
        cls, text_config = Qwen3_5MoeForCausalLM, config.text_config
    elif config.model_type == "qwen3_moe":
        cls, text_config = Qwen3MoeForCausalLM, config
    else:
        raise ValueError(f"no HF reference for model_type {config.model_type!r}")
    if hasattr(text_config, "quantization_config"):
        del text_config.quantization_config  # the reference runs on dequantised weights
    text_config._attn_implementation = "eager"

    sd = _read_safetensors(ckpt_dir)
    sd = {k: v for k, v in sd.items() if not k.startswith(("model.visual.", "mtp."))}
    sd = {re.sub(r"^model\.language_model\.", "model.", k): v for k, v in sd.items()}
    if quant is not None:
        quant = quant if isinstance(quant, dict) else quant.to_dict()
        sd = _dequantize(sd, tuple(quant["weight_block_size"]))
    sd = {k: v.to(dtype) for k, v in _fuse_experts(sd).items()}

    model = cls(text_config).to(dtype)
    model.load_state_dict(sd, strict=True)
    return model.eval()
