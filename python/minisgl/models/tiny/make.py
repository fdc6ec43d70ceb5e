"""Tiny checkpoints in the exact on-disk layout of the official Qwen checkpoints: random ones for
tests (make_tiny_model), and the same layout holding trained weights (tiny_tensors with `given`:
the embedded default model, see default.py).

The random weights are scaled so that a random model is far from degenerate: activations stay O(1) through
the layers, routing is decisive and the logits spread over several units, so greedy decoding rarely
sits on near-ties that would make engine-vs-reference comparisons flaky.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from minisgl.models.tiny import configs as cfgs
from minisgl.models.tiny.writer import to_disk, write_metadata, write_shards

ARCHS = ("qwen3_5_moe", "qwen3_moe")
_DEFAULT_LAYERS = {"qwen3_5_moe": 8, "qwen3_moe": 4}
# Projections that write into the residual stream are scaled down so each layer nudges the stream
# instead of replacing it; this keeps the model's sensitivity to bf16 rounding close to 1x (with
# gain 1 a 1e-4 weight perturbation moved the logits ~30x more, making comparisons flaky).
_OUT_GAIN = 0.3
# logits = lm_head(unit-RMS hidden) have std ~_LM_HEAD_GAIN, so the softmax is peaked, not flat.
_LM_HEAD_GAIN = 6.0


_Named = tuple[str, torch.Tensor]


class _Init:
    """Random tensors keyed by (seed, name), so each tensor is independent of generation order.

    `given` tensors (trained weights, keyed by their on-disk names) replace the draws of the same
    name, so trained and random checkpoints come out of one layout."""

    def __init__(self, seed: int, given: Mapping[str, torch.Tensor] | None = None) -> None:
        self.seed = seed
        self.given = dict(given or {})
        self.used: set[str] = set()

    def _gen(self, name: str) -> torch.Generator:
        return torch.Generator().manual_seed((self.seed * 0x9E3779B1 + zlib.crc32(name.encode())) % 2**63)

    def _take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        t = self.given.get(name)
        if t is not None:
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: given shape {tuple(t.shape)}, the layout needs {shape}")
            self.used.add(name)
        return t

    def check_all_used(self) -> None:
        unused = sorted(set(self.given) - self.used)
        if unused:
            raise ValueError(f"given tensors that the layout has no place for: {unused}")

    def normal(self, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
        t = self._take(name, shape)
        return t if t is not None else torch.randn(shape, generator=self._gen(name)) * std + mean

    def uniform(self, name: str, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
        t = self._take(name, shape)
        return t if t is not None else torch.rand(shape, generator=self._gen(name)) * (hi - lo) + lo

    def log_uniform(self, name: str, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
        t = self._take(name, shape)
        return t if t is not None else (torch.rand(shape, generator=self._gen(name)) * (hi - lo) + lo).log()

    def linear(self, name: str, out_f: int, in_f: int, gain: float = 1.0) -> _Named:
        return name, self.normal(name, (out_f, in_f), gain / math.sqrt(in_f))

    def norm(self, name: str, dim: int, centre: float) -> _Named:
        return name, self.normal(name, (dim,), 0.1, mean=centre)


def _experts(init: _Init, p: str, c: dict, fused: bool) -> Iterator[_Named]:
    e, i, h = c["num_experts"], c["moe_intermediate_size"], c["hidden_size"]
    # Drawn fused in both layouts so that the bf16 and fp8 checkpoints of a seed hold the same model.
    gate_up = init.normal(f"{p}.experts.gate_up_proj", (e, 2 * i, h), 1 / math.sqrt(h))
    down = init.normal(f"{p}.experts.down_proj", (e, h, i), _OUT_GAIN / math.sqrt(i))
    if fused:
        yield f"{p}.experts.gate_up_proj", gate_up
        yield f"{p}.experts.down_proj", down
        return
    for x in range(e):
        yield f"{p}.experts.{x}.gate_proj.weight", gate_up[x, :i].clone()
        yield f"{p}.experts.{x}.up_proj.weight", gate_up[x, i:].clone()
        yield f"{p}.experts.{x}.down_proj.weight", down[x].clone()


def _router(init: _Init, p: str, c: dict) -> Iterator[_Named]:
    # Router logits with std ~4: the runner-up expert still gets a real share of the weight, but a
    # rounding-induced swap between the k-th and (k+1)-th expert moves only a little of it.
    yield init.linear(f"{p}.gate.weight", c["num_experts"], c["hidden_size"], 4.0)


def _qwen35_layer(init: _Init, p: str, c: dict, layer_type: str, fused: bool) -> Iterator[_Named]:
    h = c["hidden_size"]
    # Zero-centred norms: the model multiplies by (1 + w).
    for n in ("input_layernorm", "post_attention_layernorm"):
        yield init.norm(f"{p}.{n}.weight", h, 0.0)
    if layer_type == "linear_attention":
        a = f"{p}.linear_attn"
        hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv, kernel = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
        conv_dim = 2 * hk * dk + hv * dv
        yield init.linear(f"{a}.in_proj_qkv.weight", conv_dim, h)
        yield init.linear(f"{a}.in_proj_z.weight", hv * dv, h)
        yield init.linear(f"{a}.in_proj_b.weight", hv, h)
        yield init.linear(f"{a}.in_proj_a.weight", hv, h)
        conv = f"{a}.conv1d.weight"
        yield conv, init.normal(conv, (conv_dim, 1, kernel), 1 / math.sqrt(kernel))
        yield f"{a}.A_log", init.log_uniform(f"{a}.A_log", (hv,), 1.0, 16.0)
        # softplus(a + dt_bias) with dt_bias in [-3, -1] keeps exp(g) away from 0, so the state carries over.
        yield f"{a}.dt_bias", init.uniform(f"{a}.dt_bias", (hv,), -3.0, -1.0)
        yield init.norm(f"{a}.norm.weight", dv, 1.0)  # plain w, not 1 + w
        yield init.linear(f"{a}.out_proj.weight", h, hv * dv, _OUT_GAIN)
    else:
        a = f"{p}.self_attn"
        nh, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        # Per head: head_dim query rows, then head_dim output-gate rows.
        yield init.linear(f"{a}.q_proj.weight", nh * d * 2, h)
        yield init.linear(f"{a}.k_proj.weight", nkv * d, h)
        yield init.linear(f"{a}.v_proj.weight", nkv * d, h)
        for n in ("q_norm", "k_norm"):
            yield init.norm(f"{a}.{n}.weight", d, 0.0)
        yield init.linear(f"{a}.o_proj.weight", h, nh * d, _OUT_GAIN)
    m = f"{p}.mlp"
    yield from _router(init, m, c)
    yield from _experts(init, m, c, fused)
    s = c["shared_expert_intermediate_size"]
    yield init.linear(f"{m}.shared_expert.gate_proj.weight", s, h)
    yield init.linear(f"{m}.shared_expert.up_proj.weight", s, h)
    yield init.linear(f"{m}.shared_expert.down_proj.weight", h, s, _OUT_GAIN)
    yield init.linear(f"{m}.shared_expert_gate.weight", 1, h)


def _qwen3_moe_layer(init: _Init, p: str, c: dict) -> Iterator[_Named]:
    h, nh, nkv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    # Plain RMSNorm weights, centred on 1.
    for n in ("input_layernorm", "post_attention_layernorm"):
        yield init.norm(f"{p}.{n}.weight", h, 1.0)
    a = f"{p}.self_attn"
    yield init.linear(f"{a}.q_proj.weight", nh * d, h)
    yield init.linear(f"{a}.k_proj.weight", nkv * d, h)
    yield init.linear(f"{a}.v_proj.weight", nkv * d, h)
    yield init.linear(f"{a}.o_proj.weight", h, nh * d, _OUT_GAIN)
    for n in ("q_norm", "k_norm"):
        yield init.norm(f"{a}.{n}.weight", d, 1.0)
    yield from _router(init, f"{p}.mlp", c)
    yield from _experts(init, f"{p}.mlp", c, fused=False)


def _tensors(arch: str, config: dict, init: _Init, fp8: bool) -> Iterator[_Named]:
    qwen35 = arch == "qwen3_5_moe"
    c = config["text_config"] if qwen35 else config
    h, v = c["hidden_size"], c["vocab_size"]
    prefix = "model.language_model" if qwen35 else "model"
    # Unit-variance embeddings set the residual scale that the _OUT_GAIN updates are relative to.
    embed = f"{prefix}.embed_tokens.weight"
    yield embed, init.normal(embed, (v, h), 1.0)
    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}.layers.{i}"
        if qwen35:
            # BF16 checkpoints fuse the experts; FP8 ones keep them per expert so each has its scales.
            yield from _qwen35_layer(init, p, c, c["layer_types"][i], fused=not fp8)
        else:
            yield from _qwen3_moe_layer(init, p, c)
    yield init.norm(f"{prefix}.norm.weight", h, 0.0 if qwen35 else 1.0)
    yield init.linear("lm_head.weight", v, h, _LM_HEAD_GAIN)
    if qwen35:
        # Stand-ins for the vision tower and the MTP head, which the engine's loader must skip.
        vh = config["vision_config"]["hidden_size"]
        yield init.norm("model.visual.blocks.0.norm1.weight", vh, 1.0)
        yield init.linear("model.visual.merger.linear_fc2.weight", h, 4 * vh)
        yield init.linear("mtp.fc.weight", h, 2 * h)
        yield init.norm("mtp.norm.weight", h, 0.0)


def tiny_config(arch: str, num_layers: int | None = None, overrides: Mapping[str, Any] | None = None) -> dict:
    """config.json contents of a tiny checkpoint; `overrides` replaces text-config fields."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    layers = _DEFAULT_LAYERS[arch] if num_layers is None else num_layers
    config = cfgs.qwen35_moe_config(layers) if arch == "qwen3_5_moe" else cfgs.qwen3_moe_config(layers)
    text = config.get("text_config", config)
    unknown = set(overrides or ()) - set(text)
    if unknown:
        raise ValueError(f"unknown text-config fields to override: {sorted(unknown)}")
    text.update(overrides or {})
    return config


def tiny_tensors(
    arch: str, config: dict, seed: int = 0, fp8: bool = False, given: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """A tiny checkpoint's tensors in model order under their on-disk names (experts fused for bf16,
    per expert for FP8), before the cast to bf16: seeded random draws, except that each `given`
    tensor (say, a trained one) takes the place of the draw of its name."""
    init = _Init(seed, given)
    out = dict(_tensors(arch, config, init, fp8))
    init.check_all_used()
    return out


def make_tiny_model(
    out_dir: str,
    arch: str = "qwen3_5_moe",
    fp8: bool = False,
    seed: int = 0,
    num_layers: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> str:
    """Write a tiny random checkpoint (config, sharded safetensors, tokenizer) to out_dir; return out_dir.

    `overrides` replaces text-config fields (say, a larger moe_intermediate_size for benchmarks)."""
    config = tiny_config(arch, num_layers, overrides)
    tensors = to_disk(tiny_tensors(arch, config, seed, fp8).items(), fp8)
    write_shards(out_dir, tensors)
    write_metadata(out_dir, config, fp8, tensors)
    return out_dir
