"""Tiny random checkpoints: on-disk layout, config parsing, FP8 form, tokenizer, determinism, HF loading."""
from __future__ import annotations

import json
import math
import os
import re
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoTokenizer

from hf_reference import load_hf_reference
from minisgl.models.tiny.default import default_model_path
from minisgl.models.tiny.make import make_tiny_model
from minisgl.models.tiny.tokenizer import ENDOFTEXT, IM_END, IM_START, special_token_ids

VARIANTS = [("qwen3_5_moe", False), ("qwen3_5_moe", True), ("qwen3_moe", False), ("qwen3_moe", True)]
FP8_MODULE = re.compile(
    r"\.(linear_attn\.(in_proj_qkv|in_proj_z|out_proj)|self_attn\.[qkvo]_proj"
    r"|mlp\.experts\.\d+\.(gate|up|down)_proj|mlp\.shared_expert\.(gate|up|down)_proj)$"
)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], str]:
    root = tmp_path_factory.mktemp("tiny")
    return {(a, f): make_tiny_model(str(root / f"{a}-{'fp8' if f else 'bf16'}"), a, f) for a, f in VARIANTS}


def _tensors(ckpt: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(ckpt).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            out.update({k: st.get_tensor(k) for k in st.keys()})
    return out


def _json(ckpt: str, name: str) -> dict:
    with open(os.path.join(ckpt, name)) as f:
        return json.load(f)


def _shapes(ckpt: str, prefix: str) -> dict[str, tuple[int, ...]]:
    return {k[len(prefix):]: tuple(v.shape) for k, v in _tensors(ckpt).items() if k.startswith(prefix)}


@pytest.mark.parametrize("arch,fp8", VARIANTS)
def test_config_parses_and_index_covers_all(ckpts: dict, arch: str, fp8: bool) -> None:
    ckpt = ckpts[arch, fp8]
    cfg = AutoConfig.from_pretrained(ckpt)
    assert cfg.model_type == arch
    text = cfg.text_config if arch == "qwen3_5_moe" else cfg
    assert (text.hidden_size, text.vocab_size, text.num_experts, text.num_experts_per_tok) == (128, 512, 8, 2)
    assert (getattr(cfg, "quantization_config", None) is not None) == fp8

    index = _json(ckpt, "model.safetensors.index.json")
    files = sorted(p.name for p in Path(ckpt).glob("*.safetensors"))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    total, seen = 0, {}
    for name in files:
        with safe_open(os.path.join(ckpt, name), "pt") as st:
            for k in st.keys():
                seen[k] = name
                t = st.get_tensor(k)
                total += t.numel() * t.element_size()
    assert index["weight_map"] == seen
    assert index["metadata"]["total_size"] == total


def test_qwen35_layout(ckpts: dict) -> None:
    raw = _tensors(ckpts["qwen3_5_moe", False])
    shapes = _shapes(ckpts["qwen3_5_moe", False], "model.language_model.")
    assert raw["lm_head.weight"].shape == (512, 128)
    assert any(k.startswith("model.visual.") for k in raw) and any(k.startswith("mtp.") for k in raw)
    assert all(t.dtype == torch.bfloat16 for t in raw.values())
    gdn = {k[len("layers.0."):]: v for k, v in shapes.items() if k.startswith("layers.0.")}
    moe = {
        "mlp.gate.weight": (8, 128),
        "mlp.experts.gate_up_proj": (8, 128, 128),
        "mlp.experts.down_proj": (8, 128, 64),
        "mlp.shared_expert.gate_proj.weight": (64, 128),
        "mlp.shared_expert.up_proj.weight": (64, 128),
        "mlp.shared_expert.down_proj.weight": (128, 64),
        "mlp.shared_expert_gate.weight": (1, 128),
        "input_layernorm.weight": (128,),
        "post_attention_layernorm.weight": (128,),
    }
    assert gdn == {
        "linear_attn.in_proj_qkv.weight": (2 * 2 * 32 + 4 * 32, 128),
        "linear_attn.in_proj_z.weight": (128, 128),
        "linear_attn.in_proj_b.weight": (4, 128),
        "linear_attn.in_proj_a.weight": (4, 128),
        "linear_attn.conv1d.weight": (256, 1, 4),
        "linear_attn.A_log": (4,),
        "linear_attn.dt_bias": (4,),
        "linear_attn.norm.weight": (32,),
        "linear_attn.out_proj.weight": (128, 128),
        **moe,
    }
    attn = {k[len("layers.3."):]: v for k, v in shapes.items() if k.startswith("layers.3.")}
    assert attn == {
        "self_attn.q_proj.weight": (4 * 64 * 2, 128),
        "self_attn.k_proj.weight": (128, 128),
        "self_attn.v_proj.weight": (128, 128),
        "self_attn.q_norm.weight": (64,),
        "self_attn.k_norm.weight": (64,),
        "self_attn.o_proj.weight": (128, 256),
        **moe,
    }
    layer_types = AutoConfig.from_pretrained(ckpts["qwen3_5_moe", False]).text_config.layer_types
    assert [t == "full_attention" for t in layer_types] == [(i + 1) % 4 == 0 for i in range(8)]
    a_log = raw["model.language_model.layers.0.linear_attn.A_log"].float()
    assert bool(((a_log >= 0) & (a_log <= math.log(16) + 1e-2)).all())


def test_qwen3_moe_layout(ckpts: dict) -> None:
    shapes = _shapes(ckpts["qwen3_moe", False], "model.layers.1.")
    expected = {
        "input_layernorm.weight": (128,),
        "post_attention_layernorm.weight": (128,),
        "self_attn.q_proj.weight": (128, 128),
        "self_attn.k_proj.weight": (64, 128),
        "self_attn.v_proj.weight": (64, 128),
        "self_attn.o_proj.weight": (128, 128),
        "self_attn.q_norm.weight": (32,),
        "self_attn.k_norm.weight": (32,),
        "mlp.gate.weight": (8, 128),
    }
    for e in range(8):
        expected |= {
            f"mlp.experts.{e}.gate_proj.weight": (64, 128),
            f"mlp.experts.{e}.up_proj.weight": (64, 128),
            f"mlp.experts.{e}.down_proj.weight": (128, 64),
        }
    assert shapes == expected
    norm = _tensors(ckpts["qwen3_moe", False])["model.layers.1.input_layernorm.weight"].float()
    assert abs(float(norm.mean()) - 1.0) < 0.1  # plain RMSNorm weight, centred on 1


@pytest.mark.parametrize("arch", ["qwen3_5_moe", "qwen3_moe"])
def test_fp8_tensors(ckpts: dict, arch: str) -> None:
    ckpt = ckpts[arch, True]
    raw = _tensors(ckpt)
    quant = _json(ckpt, "config.json")["quantization_config"]
    assert {k: quant[k] for k in ("quant_method", "fmt", "activation_scheme", "weight_block_size")} == {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    quantised = {k.removesuffix(".weight") for k, v in raw.items() if v.dtype == torch.float8_e4m3fn}
    assert quantised and all(FP8_MODULE.search(m) for m in quantised)
    for m in quantised:
        w, s = raw[f"{m}.weight"], raw[f"{m}.weight_scale_inv"]
        assert s.dtype == torch.float32
        assert s.shape == (math.ceil(w.shape[0] / 128), math.ceil(w.shape[1] / 128))
    other = {k.removesuffix(".weight") for k, v in raw.items()
             if k.endswith(".weight") and v.dtype == torch.bfloat16}
    assert not any(FP8_MODULE.search(m) for m in other)
    assert sorted(quant["modules_to_not_convert"]) == sorted(other)
    assert "lm_head" in other
    if arch == "qwen3_5_moe":  # FP8 checkpoints keep experts per expert, never fused
        assert "model.language_model.layers.0.mlp.experts.7.down_proj" in quantised
        assert not any(k.endswith("experts.gate_up_proj") for k in raw)


@pytest.mark.parametrize("arch", ["qwen3_5_moe", "qwen3_moe"])
def test_hf_reference_loads_and_is_not_degenerate(ckpts: dict, arch: str) -> None:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 512, (6, 10), generator=g)
    models = {fp8: load_hf_reference(ckpts[arch, fp8]) for fp8 in (False, True)}
    for model in models.values():
        with torch.no_grad():
            logits = model(prompts).logits
        assert logits.shape == (6, 10, 512) and bool(torch.isfinite(logits).all())
        assert logits[:, -1].argmax(-1).unique().numel() >= 3
        assert float(logits.std()) > 2.0
    # Same seed: the FP8 checkpoint is the bf16 model quantised, up to fp8 rounding per weight.
    sd8 = models[True].state_dict()
    for name, w in models[False].state_dict().items():
        assert float((sd8[name] - w).norm() / w.norm().clamp_min(1e-12)) < 0.04, name


@pytest.mark.parametrize("arch", ["qwen3_5_moe", "qwen3_moe"])
def test_tokenizer_round_trip(ckpts: dict, arch: str) -> None:
    ckpt = ckpts[arch, False]
    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = special_token_ids()
    assert {t: tok.convert_tokens_to_ids(t) for t in (ENDOFTEXT, IM_START, IM_END)} == ids
    assert tok.eos_token == IM_END and tok.pad_token == ENDOFTEXT
    assert len(tok) <= _json(ckpt, "config.json").get("text_config", _json(ckpt, "config.json"))["vocab_size"]
    text = "Hello, café! 中文 and emoji ✓ 42"
    enc = tok.encode(text, add_special_tokens=False)
    assert tok.decode(enc) == text
    # For qwen3_5_moe AutoTokenizer rebuilds Qwen3.5's own pipeline around the vocab; it must still
    # agree with tokenizer.json as the plain tokenizers library reads it.
    raw = Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json"))
    for t in (text, "In 2024 there were 42 cats.\n\n  I'M here <|im_end|>"):
        assert tok.encode(t, add_special_tokens=False) == raw.encode(t).ids
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi é"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi é<|im_end|>\n<|im_start|>assistant\n<think>\n"
    chat_ids = tok.encode(chat, add_special_tokens=False)
    assert chat_ids[0] == ids[IM_START] and chat_ids.count(ids[IM_END]) == 1
    gen = _json(ckpt, "generation_config.json")
    assert gen["eos_token_id"] == [ids[IM_END], ids[ENDOFTEXT]]


def test_seed_determinism(tmp_path: Path) -> None:
    def blobs(seed: int, name: str) -> dict[str, bytes]:
        d = make_tiny_model(str(tmp_path / name), seed=seed, num_layers=4)
        return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir())}

    a, b, c = blobs(0, "a"), blobs(0, "b"), blobs(1, "c")
    assert a == b
    shards = [n for n in a if n.endswith(".safetensors")]
    assert len(shards) == 2 and all(a[n] != c[n] for n in shards)
    layer_types = AutoConfig.from_pretrained(str(tmp_path / "a")).text_config.layer_types
    assert layer_types == ["linear_attention"] * 3 + ["full_attention"]


def test_default_model_path_is_cached_and_race_safe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE", str(tmp_path))
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(default_model_path())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 3
    path = results[0]
    assert os.path.dirname(path) == str(tmp_path) and "qwen3_5_moe-trained-bf16" in path
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]  # no temp dirs left behind
    mtime = os.path.getmtime(os.path.join(path, "config.json"))
    assert default_model_path() == path
    assert os.path.getmtime(os.path.join(path, "config.json")) == mtime
