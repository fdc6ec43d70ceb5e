"""HF `config.json` -> ModelConfig, for the architectures minisgl runs.

Everything the engine needs is resolved here once, so no other module reads raw HF configs. Each
field is read as HF transformers' own config classes and modeling code read it (5.x): where a
config leaves a field out, HF's default applies (or the config is refused, with the field named);
where HF's modeling ignores a field, a value that would make minisgl compute something else is
refused with a message rather than honoured differently.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"

# model_type -> the architecture family minisgl implements for it.
_SUPPORTED = {
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_moe": "qwen3_moe",
}


# HF's defaults for fields a config may leave out (transformers 5.x config classes).
_DEFAULT_ROPE_THETA = 10000.0  # RotaryEmbeddingConfigMixin.default_theta
_QWEN35_HEAD_DIM = 256  # Qwen3_5MoeTextConfig.head_dim
_QWEN35_PARTIAL_ROTARY = 0.25  # set by Qwen3_5MoeTextConfig.__post_init__
_QWEN35_FULL_ATTENTION_INTERVAL = 4


class ConfigError(ValueError):
    """A config that minisgl cannot run, with the reason in the message."""


@dataclass(frozen=True)
class QuantConfig:
    method: str  # "fp8"
    block: tuple[int, int]
    modules_to_not_convert: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "qwen3_5_moe" | "qwen3_moe"
    vocab_size: int
    hidden_size: int
    num_layers: int
    layer_types: tuple[str, ...]
    rms_norm_eps: float
    tie_word_embeddings: bool
    # Full attention.
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rotary_dim: int  # partial rotary: the first rotary_dim dims of each head rotate
    attn_output_gate: bool
    max_position_embeddings: int
    # MoE.
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int  # 0 = no shared expert
    norm_topk_prob: bool
    # Gated DeltaNet (zero when the model has no linear-attention layers).
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    mamba_ssm_dtype: str = "float32"
    # 1 + w ("zero-centred") RMSNorm weights (Qwen3.5) versus plain w (Qwen3).
    zero_centered_norm: bool = False
    dtype: str = "bfloat16"
    eos_token_ids: tuple[int, ...] = ()
    quant: QuantConfig | None = None

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim


def _require(cfg: dict[str, Any], key: str, where: str) -> Any:
    if key not in cfg:
        raise ConfigError(f"{where}: missing required field {key!r}")
    return cfg[key]


def _rope(text: dict[str, Any], head_dim: int, arch: str, where: str) -> tuple[float, int]:
    """(theta, rotary dim). HF takes a legacy rope_scaling dict instead of rope_parameters when
    present, then each value from the dict, else the top level, else its default."""
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"{where}: rope_type {rope_type!r} is not supported (only 'default')")
    theta = rope.get("rope_theta", text.get("rope_theta", _DEFAULT_ROPE_THETA))
    factor = rope.get("partial_rotary_factor", text.get("partial_rotary_factor"))
    if arch == "qwen3_moe":
        if factor not in (None, 1, 1.0):
            raise ConfigError(
                f"{where}: partial_rotary_factor {factor} on Qwen3-MoE: transformers' Qwen3-MoE rotates the "
                f"whole head and ignores it, so the checkpoint's meaning is ambiguous; remove it or set 1.0"
            )
        factor = 1.0
    elif factor is None:
        factor = _QWEN35_PARTIAL_ROTARY
    rotary_dim = int(head_dim * factor)
    if rotary_dim % 2:
        raise ConfigError(f"{where}: rotary dim {rotary_dim} must be even")
    return float(theta), rotary_dim


def _layer_types(text: dict[str, Any], num_layers: int, where: str) -> tuple[str, ...]:
    types = text.get("layer_types")
    if types is None:
        interval = text.get("full_attention_interval", _QWEN35_FULL_ATTENTION_INTERVAL)
        types = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)]
    if len(types) != num_layers:
        raise ConfigError(f"{where}: layer_types has {len(types)} entries for {num_layers} layers")
    bad = sorted(set(types) - {FULL_ATTENTION, LINEAR_ATTENTION})
    if bad:
        raise ConfigError(f"{where}: unknown layer types {bad}")
    return tuple(types)


def _eos_ids(model_dir: str | None, text: dict[str, Any]) -> tuple[int, ...]:
    eos: Any = None
    if model_dir is not None:
        gen_path = os.path.join(model_dir, "generation_config.json")
        if os.path.exists(gen_path):
            with open(gen_path) as f:
                eos = json.load(f).get("eos_token_id")
    if eos is None:
        eos = text.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _quant(raw: dict[str, Any], where: str) -> QuantConfig | None:
    q = raw.get("quantization_config")
    if q is None:
        return None
    method = q.get("quant_method")
    if method != "fp8":
        raise ConfigError(f"{where}: quantization method {method!r} is not supported (only 'fp8')")
    block = q.get("weight_block_size")
    if block is None or len(block) != 2:
        raise ConfigError(f"{where}: fp8 checkpoints need 'weight_block_size' [n, k]; per-tensor fp8 is not supported")
    return QuantConfig("fp8", (int(block[0]), int(block[1])), tuple(q.get("modules_to_not_convert") or ()))


def parse_config(raw: dict[str, Any], model_dir: str | None = None) -> ModelConfig:
    where = os.path.join(model_dir, "config.json") if model_dir else "config"
    model_type = raw.get("model_type")
    if model_type not in _SUPPORTED:
        archs = raw.get("architectures")
        raise ConfigError(
            f"{where}: unsupported architecture (model_type={model_type!r}, architectures={archs}); "
            f"minisgl supports model_type {sorted(_SUPPORTED)}"
        )
    arch = _SUPPORTED[model_type]
    text = raw.get("text_config", raw) if model_type == "qwen3_5_moe" else raw
    if model_type == "qwen3_5_moe" and "text_config" not in raw:
        raise ConfigError(f"{where}: model_type 'qwen3_5_moe' needs a nested 'text_config'")

    req = lambda key: _require(text, key, where)  # noqa: E731
    hidden = req("hidden_size")
    num_layers = req("num_hidden_layers")
    num_heads = req("num_attention_heads")
    # Qwen3.5's config class declares head_dim (default 256); Qwen3-MoE's modeling falls back to hidden / heads.
    head_dim = text.get("head_dim", _QWEN35_HEAD_DIM if arch == "qwen3_5_moe" else hidden // num_heads)
    if not isinstance(head_dim, int) or head_dim < 1:
        raise ConfigError(f"{where}: head_dim must be a positive integer, got {head_dim!r}")
    theta, rotary_dim = _rope(text, head_dim, arch, where)
    if text.get("attention_bias", False):
        raise ConfigError(f"{where}: attention_bias true (biased q/k/v/o projections) is not supported")
    if text.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: hidden_act {text['hidden_act']!r} is not supported (only 'silu')")
    dtype = text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    common = dict(
        arch=arch,
        vocab_size=req("vocab_size"),
        hidden_size=hidden,
        num_layers=num_layers,
        rms_norm_eps=req("rms_norm_eps"),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        num_heads=num_heads,
        num_kv_heads=req("num_key_value_heads"),
        head_dim=head_dim,
        rope_theta=theta,
        rotary_dim=rotary_dim,
        max_position_embeddings=req("max_position_embeddings"),
        # transformers 5.x writes Qwen3-MoE's expert count as num_local_experts (num_experts is an alias).
        num_experts=text["num_experts"] if "num_experts" in text else req("num_local_experts"),
        top_k=req("num_experts_per_tok"),
        moe_intermediate_size=req("moe_intermediate_size"),
        dtype=str(dtype),
        eos_token_ids=_eos_ids(model_dir, text),
        quant=_quant(raw, where),
    )
    if arch == "qwen3_moe":
        if text.get("decoder_sparse_step", 1) != 1 or text.get("mlp_only_layers"):
            raise ConfigError(f"{where}: dense (non-MoE) layers via mlp_only_layers/decoder_sparse_step are not supported")
        if text.get("use_sliding_window"):
            raise ConfigError(f"{where}: sliding-window attention is not supported")
        return ModelConfig(
            **common,
            layer_types=(FULL_ATTENTION,) * num_layers,
            attn_output_gate=False,
            shared_expert_intermediate_size=0,
            norm_topk_prob=bool(text.get("norm_topk_prob", False)),
        )
    # transformers' Qwen3.5 always gates attention and renormalises the top-k router weights,
    # whatever these fields say: a config that says otherwise cannot mean what HF computes.
    if text.get("attn_output_gate", True) is not True:
        raise ConfigError(f"{where}: Qwen3.5 without the attention output gate is not supported")
    if text.get("norm_topk_prob", True) is not True:
        raise ConfigError(
            f"{where}: norm_topk_prob false on Qwen3.5: transformers' Qwen3.5 always renormalises the top-k "
            f"router weights and ignores the field; remove it or set true"
        )
    return ModelConfig(
        **common,
        layer_types=_layer_types(text, num_layers, where),
        attn_output_gate=True,
        shared_expert_intermediate_size=req("shared_expert_intermediate_size"),
        norm_topk_prob=True,
        linear_num_key_heads=req("linear_num_key_heads"),
        linear_num_value_heads=req("linear_num_value_heads"),
        linear_key_head_dim=req("linear_key_head_dim"),
        linear_value_head_dim=req("linear_value_head_dim"),
        linear_conv_kernel_dim=req("linear_conv_kernel_dim"),
        mamba_ssm_dtype=str(text.get("mamba_ssm_dtype", "float32")),
        zero_centered_norm=True,
    )


def load_config(model_dir: str) -> ModelConfig:
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"model path {model_dir!r} does not exist or is not a directory")
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir!r} has no config.json")
    with open(path) as f:
        raw = json.load(f)
    return parse_config(raw, model_dir)
