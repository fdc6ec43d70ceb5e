"""The strict loader: both prefixes and expert layouts, FP8, role filters, and named errors."""
from __future__ import annotations

import glob
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from minisgl.models.config import load_config
from minisgl.models.context import Backends
from minisgl.models.qwen3_5_moe import Qwen3_5MoeForCausalLM
from minisgl.models.weights import WeightError, WeightFilter, load_weights
from minisgl.moe.local_moe import ExpertWeights


def _build(path: str) -> Qwen3_5MoeForCausalLM:
    config = load_config(path)
    return Qwen3_5MoeForCausalLM(config, Backends(None, None, None))


def _load(path: str, wf: WeightFilter | None = None, model: nn.Module | None = None) -> nn.Module:
    model = model if model is not None else _build(path)
    load_weights(model, path, load_config(path), wf)
    return model


def _all_tensors(path: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        out.update(load_file(f))
    return out


def _rewrite(src: str, dst: str, tensors: dict[str, torch.Tensor]) -> str:
    """A copy of the checkpoint's metadata files with `tensors` as one unindexed shard."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return dst


def test_checkpoint_carries_skipped_towers(tiny_checkpoints) -> None:
    names = _all_tensors(tiny_checkpoints["bf16"]).keys()
    assert any(n.startswith("model.visual.") for n in names) and any(n.startswith("mtp.") for n in names)
    assert all(n.startswith(("model.language_model.", "model.visual.", "mtp.", "lm_head.")) for n in names)


def test_per_expert_and_fused_layouts_load_identically(tiny_checkpoints, tmp_path) -> None:
    src = tiny_checkpoints["bf16"]
    tensors = _all_tensors(src)
    split: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                split[f"{base}{e}.gate_proj.weight"] = t[e, :inter].clone()
                split[f"{base}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                split[f"{base}{e}.down_proj.weight"] = t[e].clone()
        else:
            split[name] = t
    other = _rewrite(src, str(tmp_path / "per_expert"), split)
    a, b = _load(src).state_dict(), _load(other).state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_fp8_weights_are_dequantised_by_block(tiny_checkpoints) -> None:
    path = tiny_checkpoints["fp8"]
    tensors = _all_tensors(path)
    name = "model.language_model.layers.0.mlp.experts.3.up_proj.weight"
    wq, scale = tensors[name], tensors[name + "_scale_inv"]
    assert wq.dtype == torch.float8_e4m3fn
    ref = wq.float() * scale.repeat_interleave(128, 0)[: wq.shape[0]].repeat_interleave(128, 1)[:, : wq.shape[1]]
    model = _load(path)
    inter = model.config.moe_intermediate_size
    got = model.layers[0].mlp.experts.gate_up_proj[3, inter:]
    assert torch.equal(got, ref.to(got.dtype))


def test_missing_tensor_is_named(tiny_checkpoints, tmp_path) -> None:
    tensors = _all_tensors(tiny_checkpoints["bf16"])
    name = "model.language_model.layers.2.linear_attn.A_log"
    del tensors[name]
    bad = _rewrite(tiny_checkpoints["bf16"], str(tmp_path / "m"), tensors)
    with pytest.raises(WeightError, match="missing tensor 'model.language_model.layers.2.linear_attn.A_log'"):
        _load(bad)


def test_missing_expert_is_named_in_checkpoint_form(tiny_checkpoints, tmp_path) -> None:
    tensors = _all_tensors(tiny_checkpoints["fp8"])
    name = "model.language_model.layers.1.mlp.experts.5.down_proj.weight"
    del tensors[name], tensors[name + "_scale_inv"]
    bad = _rewrite(tiny_checkpoints["fp8"], str(tmp_path / "m"), tensors)
    with pytest.raises(WeightError, match=f"missing tensor '{name}'"):
        _load(bad)


def test_unexpected_tensor_is_named(tiny_checkpoints, tmp_path) -> None:
    tensors = _all_tensors(tiny_checkpoints["bf16"])
    tensors["model.language_model.layers.0.linear_attn.bogus.weight"] = torch.ones(2)
    bad = _rewrite(tiny_checkpoints["bf16"], str(tmp_path / "m"), tensors)
    with pytest.raises(WeightError, match="unexpected tensor 'model.language_model.layers.0.linear_attn.bogus.weight'"):
        _load(bad)


def test_misshaped_tensor_is_named(tiny_checkpoints, tmp_path) -> None:
    tensors = _all_tensors(tiny_checkpoints["bf16"])
    name = "model.language_model.layers.3.self_attn.k_proj.weight"
    tensors[name] = tensors[name][:-1].clone()
    bad = _rewrite(tiny_checkpoints["bf16"], str(tmp_path / "m"), tensors)
    with pytest.raises(WeightError, match=f"tensor '{name}' has shape"):
        _load(bad)


def test_fp8_weight_without_scale_is_named(tiny_checkpoints, tmp_path) -> None:
    tensors = _all_tensors(tiny_checkpoints["fp8"])
    name = "model.language_model.layers.0.linear_attn.out_proj.weight"
    del tensors[name + "_scale_inv"]
    bad = _rewrite(tiny_checkpoints["fp8"], str(tmp_path / "m"), tensors)
    with pytest.raises(WeightError, match=f"fp8 tensor '{name}' has no"):
        _load(bad)


def test_index_naming_a_missing_shard(tiny_checkpoints, tmp_path) -> None:
    dst = str(tmp_path / "m")
    shutil.copytree(tiny_checkpoints["bf16"], dst)
    os.remove(sorted(glob.glob(os.path.join(dst, "*.safetensors")))[0])
    with pytest.raises(WeightError, match="does not exist"):
        _load(dst)


def test_attention_worker_filter_loads_everything_but_routed_experts(tiny_checkpoints) -> None:
    path = tiny_checkpoints["fp8"]
    full = _load(path)
    model = _build(path)
    for layer in model.layers:
        del layer.mlp.experts  # an attention worker holds no routed experts
    _load(path, WeightFilter.attention_worker(), model)
    full_sd = full.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, full_sd[k]), k


@pytest.mark.parametrize("ckpt", ["bf16", "fp8"])
def test_expert_worker_filter_loads_only_its_experts(tiny_checkpoints, ckpt: str) -> None:
    path = tiny_checkpoints[ckpt]
    config = load_config(path)
    full = _load(path)
    start, end = 2, 6
    model = nn.Module()
    model.layers = nn.ModuleList()
    for _ in range(config.num_layers):
        layer = nn.Module()
        layer.mlp = nn.Module()
        layer.mlp.experts = ExpertWeights(start, end - start, config.hidden_size, config.moe_intermediate_size)
        model.layers.append(layer)
    _load(path, WeightFilter.expert_worker(start, end), model)
    for i, layer in enumerate(model.layers):
        ref = full.layers[i].mlp.experts
        assert torch.equal(layer.mlp.experts.gate_up_proj, ref.gate_up_proj[start:end])
        assert torch.equal(layer.mlp.experts.down_proj, ref.down_proj[start:end])


def test_index_lists_every_tensor(tiny_checkpoints) -> None:
    path = tiny_checkpoints["bf16"]
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        index = json.load(f)["weight_map"]
    assert set(index) == set(_all_tensors(path))
