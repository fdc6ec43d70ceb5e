"""Memory arithmetic of an AFD deployment, from the model config alone (no checkpoint needed).

An attention GPU holds everything but the routed experts (embeddings, lm_head, attention and GDN
projections, router, shared expert) plus, per running request, its GDN state (fp32 SSM state and
conv state) and the K/V pages of the full-attention layers. An expert GPU holds 1/N of the routed
experts. Weights count the matrices (FP8 with one fp32 scale per 128x128 block where the
checkpoint quantises them, else bf16); norms and per-head vectors are far below 0.1% and left out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from minisgl.kvcache.pages import _num_pages
from minisgl.models.config import ModelConfig

GIB = 1 << 30
MIB = 1 << 20
BF16 = 2
FP32 = 4
FP8_BLOCK = 128


def _matrix(out_dim: int, in_dim: int, fp8: bool) -> int:
    if not fp8:
        return out_dim * in_dim * BF16
    return out_dim * in_dim + math.ceil(out_dim / FP8_BLOCK) * math.ceil(in_dim / FP8_BLOCK) * FP32


def attention_gpu_weight_bytes(cfg: ModelConfig) -> int:
    fp8 = cfg.quant is not None
    h = cfg.hidden_size
    total = 2 * _matrix(cfg.vocab_size, h, False)  # embeddings and the untied lm_head
    gdn = (_matrix(cfg.conv_dim, h, fp8) + _matrix(cfg.linear_value_dim, h, fp8)  # in_proj_qkv, in_proj_z
           + 2 * _matrix(cfg.linear_num_value_heads, h, False)  # in_proj_b, in_proj_a
           + _matrix(h, cfg.linear_value_dim, fp8))  # out_proj
    q_rows = cfg.num_heads * cfg.head_dim * (2 if cfg.attn_output_gate else 1)
    kv_rows = cfg.num_kv_heads * cfg.head_dim
    attn = (_matrix(q_rows, h, fp8) + 2 * _matrix(kv_rows, h, fp8)
            + _matrix(h, cfg.num_heads * cfg.head_dim, fp8))
    shared = cfg.shared_expert_intermediate_size
    moe_local = (_matrix(cfg.num_experts, h, False)  # router
                 + 3 * _matrix(shared, h, fp8) + _matrix(1, h, False))  # shared expert and its gate
    return total + len(cfg.linear_layers) * gdn + len(cfg.full_layers) * attn + cfg.num_layers * moe_local


def expert_gpu_weight_bytes(cfg: ModelConfig, expert_workers: int) -> int:
    """One expert GPU's share: E/N experts (gate, up, down) in every layer."""
    fp8 = cfg.quant is not None
    i, h = cfg.moe_intermediate_size, cfg.hidden_size
    per_expert = 2 * _matrix(i, h, fp8) + _matrix(h, i, fp8)
    return cfg.num_layers * (cfg.num_experts // expert_workers) * per_expert


@dataclass(frozen=True)
class RequestMemory:
    ssm_state: int
    conv_state: int
    kv: int

    @property
    def total(self) -> int:
        return self.ssm_state + self.conv_state + self.kv


def request_bytes(cfg: ModelConfig, max_seq_len: int, page_size: int) -> RequestMemory:
    """What one running request holds on its attention GPU at max_seq_len: SSM state (fp32 by
    default) and bf16 conv state per GDN layer, and whole K/V pages per full-attention layer."""
    n_gdn = len(cfg.linear_layers)
    ssm_elem = FP32 if cfg.mamba_ssm_dtype == "float32" else BF16
    ssm = n_gdn * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * ssm_elem
    conv = n_gdn * cfg.conv_dim * (cfg.linear_conv_kernel_dim - 1) * BF16
    kv_per_token = len(cfg.full_layers) * 2 * cfg.num_kv_heads * cfg.head_dim * BF16
    kv = _num_pages(max_seq_len, page_size) * page_size * kv_per_token
    return RequestMemory(ssm, conv, kv)


@dataclass(frozen=True)
class MemoryPlan:
    request: RequestMemory
    attn_weights: int  # bytes on each attention GPU
    attn_requests: int  # bytes of one lane's requests
    expert_weights: int  # bytes on each expert GPU
    gpu_bytes: int

    @property
    def attn_ratio(self) -> float:
        return (self.attn_weights + self.attn_requests) / self.gpu_bytes

    @property
    def expert_ratio(self) -> float:
        return self.expert_weights / self.gpu_bytes


def memory_plan(cfg: ModelConfig, lane_batch: int, max_seq_len: int, page_size: int, expert_workers: int,
                gpu_gib: float) -> MemoryPlan:
    req = request_bytes(cfg, max_seq_len, page_size)
    return MemoryPlan(req, attention_gpu_weight_bytes(cfg), lane_batch * req.total,
                      expert_gpu_weight_bytes(cfg, expert_workers), int(gpu_gib * GIB))
