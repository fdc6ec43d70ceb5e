"""minisgl reads config.json as transformers does: configs written by transformers' own classes
(`save_pretrained`, some then stripped of a field to test HF's default), parsed by minisgl and
compared with what HF's modeling code builds from the same file -- or refused with a message
where HF ignores a field that minisgl would otherwise honour differently."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from transformers import AutoConfig, Qwen3_5MoeConfig, Qwen3MoeConfig
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf35
from transformers.models.qwen3_moe import modeling_qwen3_moe as hf3

from minisgl.models.config import ConfigError, ModelConfig, load_config

TEXT = dict(vocab_size=300, hidden_size=96, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
            head_dim=48, moe_intermediate_size=32, shared_expert_intermediate_size=40, num_experts=6,
            num_experts_per_tok=3, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=24, linear_conv_kernel_dim=3, max_position_embeddings=512, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5})
QWEN3 = dict(vocab_size=300, hidden_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             moe_intermediate_size=32, num_experts=6, num_experts_per_tok=2, max_position_embeddings=512,
             rms_norm_eps=1e-5, norm_topk_prob=True)


def written(tmp_path: Path, config: Any, edit: Callable[[dict], None] | None = None) -> str:
    """save_pretrained, then optionally edit the JSON (to drop a field)."""
    config.save_pretrained(tmp_path)
    if edit is not None:
        path = tmp_path / "config.json"
        raw = json.loads(path.read_text())
        edit(raw.get("text_config", raw))
        path.write_text(json.dumps(raw))
    return str(tmp_path)


def hf_view(path: str) -> dict[str, Any]:
    """The values HF's modeling code derives from the config at path."""
    cfg = AutoConfig.from_pretrained(path)
    qwen35 = cfg.model_type == "qwen3_5_moe"
    text = cfg.text_config if qwen35 else cfg
    mod = hf35 if qwen35 else hf3
    rotary = (mod.Qwen3_5MoeTextRotaryEmbedding if qwen35 else mod.Qwen3MoeRotaryEmbedding)(text)
    attn_layer = text.layer_types.index("full_attention") if qwen35 else 0
    attn = (mod.Qwen3_5MoeAttention if qwen35 else mod.Qwen3MoeAttention)(text, attn_layer)
    return {
        "head_dim": attn.head_dim, "rotary_dim": 2 * rotary.inv_freq.numel(),
        "rope_theta": float(rotary.inv_freq[1].double() ** -rotary.inv_freq.numel()),  # inv_freq[i] = theta^(-2i/dim)
        "num_experts": text.num_experts, "top_k": text.num_experts_per_tok,
        "layer_types": tuple(text.layer_types) if qwen35 else ("full_attention",) * text.num_hidden_layers,
        "num_heads": text.num_attention_heads, "num_kv_heads": text.num_key_value_heads,
        "vocab_size": text.vocab_size, "hidden_size": text.hidden_size, "rms_norm_eps": text.rms_norm_eps,
    }


def ours(c: ModelConfig) -> dict[str, Any]:
    return {"head_dim": c.head_dim, "rotary_dim": c.rotary_dim, "rope_theta": c.rope_theta,
            "num_experts": c.num_experts, "top_k": c.top_k, "layer_types": c.layer_types, "num_heads": c.num_heads,
            "num_kv_heads": c.num_kv_heads, "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "rms_norm_eps": c.rms_norm_eps}


def check_same(path: str) -> ModelConfig:
    c = load_config(path)
    want, got = hf_view(path), ours(c)
    assert want.pop("rope_theta") == pytest.approx(got.pop("rope_theta"), rel=1e-4)
    assert got == want
    return c


def _drop(*keys: str) -> Callable[[dict], None]:
    def edit(text: dict) -> None:
        node = text
        for k in keys[:-1]:
            node = node[k]
        node.pop(keys[-1])
    return edit


@pytest.mark.parametrize("edit", [
    None,
    _drop("rope_parameters", "partial_rotary_factor"),  # HF's default 0.25, not 1.0
    _drop("head_dim"),  # HF's default 256, not hidden / heads
    _drop("layer_types"),  # full attention every 4th layer
    _drop("rope_parameters", "rope_theta"),  # 10000
])
def test_qwen35_reads_as_hf(tmp_path: Path, edit) -> None:
    c = check_same(written(tmp_path, Qwen3_5MoeConfig(text_config=TEXT), edit))
    assert c.norm_topk_prob and c.attn_output_gate


def test_qwen3_moe_num_local_experts(tmp_path: Path) -> None:
    path = written(tmp_path, Qwen3MoeConfig(**QWEN3))
    raw = json.loads((tmp_path / "config.json").read_text())
    assert "num_local_experts" in raw and "num_experts" not in raw  # how transformers 5.x writes it
    assert check_same(path).num_experts == 6


def test_qwen3_moe_rope_scaling_replaces_rope_parameters(tmp_path: Path) -> None:
    def legacy(raw: dict) -> None:
        raw["rope_scaling"] = {"type": "default", "rope_theta": 123.0}

    assert check_same(written(tmp_path, Qwen3MoeConfig(**QWEN3), legacy)).rope_theta == 123.0


def test_qwen3_moe_partial_rotary_is_refused(tmp_path: Path) -> None:
    path = written(tmp_path, Qwen3MoeConfig(**QWEN3, head_dim=32, partial_rotary_factor=0.5))
    assert hf_view(path)["rotary_dim"] == 32  # HF rotates the whole head
    with pytest.raises(ConfigError, match="partial_rotary_factor"):
        load_config(path)


def test_qwen35_norm_topk_prob_false_is_refused(tmp_path: Path) -> None:
    path = written(tmp_path, Qwen3_5MoeConfig(text_config={**TEXT, "norm_topk_prob": False}))
    router = hf35.Qwen3_5MoeTopKRouter(AutoConfig.from_pretrained(path).text_config)
    torch.nn.init.normal_(router.weight)
    _, scores, _ = router(torch.randn(5, TEXT["hidden_size"]))
    assert torch.allclose(scores.sum(-1), torch.ones(5))  # HF renormalises regardless
    with pytest.raises(ConfigError, match="norm_topk_prob"):
        load_config(path)


@pytest.mark.parametrize("field,value,match", [("attention_bias", True, "attention_bias"),
                                               ("hidden_act", "gelu", "hidden_act")])
def test_fields_minisgl_cannot_run_are_refused(tmp_path: Path, field: str, value: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(written(tmp_path, Qwen3_5MoeConfig(text_config={**TEXT, field: value})))
