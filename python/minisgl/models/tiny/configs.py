"""config.json contents of the tiny random test checkpoints, mirroring the fields of the official configs."""
from __future__ import annotations

from typing import Any

from minisgl.models.tiny.tokenizer import ENDOFTEXT, IM_END, special_token_ids

FP8_BLOCK = (128, 128)


def _token_ids() -> dict[str, Any]:
    ids = special_token_ids()
    # Like the real configs: bos/pad are <|endoftext|>, eos lists <|im_end|> then <|endoftext|>.
    return {
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]],
        "pad_token_id": ids[ENDOFTEXT],
    }


def qwen35_moe_config(num_layers: int) -> dict[str, Any]:
    """Top-level Qwen3_5MoeForConditionalGeneration config with a nested text_config and a vision stub."""
    interval = 4
    layer_types = [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
    ]
    text_config = {
        "model_type": "qwen3_5_moe_text",
        "vocab_size": 512,
        "hidden_size": 128,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "tie_word_embeddings": False,
        # Rotary dim = 64 * 0.25 = 16, i.e. 8 frequencies, which the mrope sections must sum to.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "full_attention_interval": interval,
        "layer_types": layer_types,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "mamba_ssm_dtype": "float32",
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "norm_topk_prob": True,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "dtype": "bfloat16",
        **_token_ids(),
    }
    vision_config = {
        "model_type": "qwen3_5_moe_vision",
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "hidden_act": "gelu_pytorch_tanh",
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 128,
        "num_position_embeddings": 64,
        "initializer_range": 0.02,
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "text_config": text_config,
        "vision_config": vision_config,
    }


def qwen3_moe_config(num_layers: int) -> dict[str, Any]:
    """Flat Qwen3MoeForCausalLM config (every layer sparse)."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": num_layers,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "norm_topk_prob": True,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "dtype": "bfloat16",
        **_token_ids(),
    }


def fp8_quantization_config(modules_to_not_convert: list[str]) -> dict[str, Any]:
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(FP8_BLOCK),
        "modules_to_not_convert": modules_to_not_convert,
    }


def generation_config() -> dict[str, Any]:
    ids = _token_ids()
    return {"bos_token_id": ids["bos_token_id"], "eos_token_id": ids["eos_token_id"],
            "pad_token_id": ids["pad_token_id"], "do_sample": False}
