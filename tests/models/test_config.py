import json

import pytest

from minisgl.models.config import FULL_ATTENTION, LINEAR_ATTENTION, ConfigError, load_config, parse_config
from minisgl.models.known_configs import hf_config, known_models


def test_known_models() -> None:
    assert known_models() == ["Qwen3.5-122B-A10B", "Qwen3.5-35B-A3B", "Qwen3.5-397B-A17B"]


def test_qwen35_122b_fields() -> None:
    c = parse_config(hf_config("Qwen3.5-122B-A10B", fp8=True))
    assert c.arch == "qwen3_5_moe" and c.num_layers == 48 and c.hidden_size == 3072
    assert c.full_layers == tuple(range(3, 48, 4)) and len(c.linear_layers) == 36
    assert c.layer_types[:4] == (LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (32, 2, 256)
    assert c.rotary_dim == 64 and c.rope_theta == 1e7 and c.attn_output_gate
    assert (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim) == (16, 64, 128)
    assert c.conv_dim == 2 * 16 * 128 + 64 * 128 and c.linear_conv_kernel_dim == 4
    assert (c.num_experts, c.top_k, c.moe_intermediate_size, c.shared_expert_intermediate_size) == (256, 8, 1024, 1024)
    assert c.norm_topk_prob and c.zero_centered_norm and c.mamba_ssm_dtype == "float32"
    assert c.quant is not None and c.quant.block == (128, 128)
    assert c.eos_token_ids == (248046, 248044)


def test_qwen35_397b_fields() -> None:
    c = parse_config(hf_config("Qwen3.5-397B-A17B"))
    assert c.num_layers == 60 and len(c.full_layers) == 15 and (c.num_experts, c.top_k) == (512, 10)
    assert c.quant is None


def test_layer_types_list_wins_and_bare_text_config_parses() -> None:
    text = hf_config("Qwen3.5-35B-A3B")["text_config"]
    text["layer_types"] = [FULL_ATTENTION] * 2 + [LINEAR_ATTENTION] * 38
    c = parse_config(text)  # bare qwen3_5_moe_text
    assert c.full_layers == (0, 1)


def test_qwen3_moe_config() -> None:
    raw = {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 100, "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 128, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": False,
    }
    c = parse_config(raw)
    assert c.arch == "qwen3_moe" and c.full_layers == (0, 1) and not c.linear_layers
    assert c.rotary_dim == 8 and not c.attn_output_gate and not c.zero_centered_norm and not c.norm_topk_prob
    assert c.shared_expert_intermediate_size == 0


def test_unsupported_architecture_is_named() -> None:
    with pytest.raises(ConfigError, match="llama"):
        parse_config({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})


def test_missing_field_is_named() -> None:
    raw = hf_config("Qwen3.5-122B-A10B")
    del raw["text_config"]["linear_num_value_heads"]
    with pytest.raises(ConfigError, match="linear_num_value_heads"):
        parse_config(raw)


def test_unsupported_quantization_is_named() -> None:
    raw = hf_config("Qwen3.5-122B-A10B")
    raw["quantization_config"] = {"quant_method": "awq"}
    with pytest.raises(ConfigError, match="awq"):
        parse_config(raw)


def test_eos_from_generation_config(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(hf_config("Qwen3.5-35B-A3B")))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert load_config(str(tmp_path)).eos_token_ids == (7, 9)


def test_nonexistent_path() -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config("/nonexistent/model")
