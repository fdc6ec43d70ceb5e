"""Full attention with per-head q/k norm, partial RoPE and (Qwen3.5) a sigmoid output gate."""
from __future__ import annotations

import torch
from torch import nn

from minisgl.attention.paged_kv import PagedKV
from minisgl.layers.linear import Linear
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding
from minisgl.models.config import ModelConfig
from minisgl.models.context import ForwardContext


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding, backend: object) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = d = config.head_dim
        self.gated = config.attn_output_gate
        h = config.hidden_size
        # With the gate, each head's q_proj rows are [query (d), gate (d)].
        self.q_proj = Linear(h, self.num_heads * d * (2 if self.gated else 1))
        self.k_proj = Linear(h, self.num_kv_heads * d)
        self.v_proj = Linear(h, self.num_kv_heads * d)
        self.o_proj = Linear(self.num_heads * d, h)
        self.q_norm = RMSNorm(d, config.rms_norm_eps, config.zero_centered_norm)
        self.k_norm = RMSNorm(d, config.rms_norm_eps, config.zero_centered_norm)
        self.rotary = rotary
        self.backend = backend

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        t, d = x.shape[0], self.head_dim
        q = self.q_proj(x)
        gate = None
        if self.gated:
            q, gate = q.view(t, self.num_heads, 2 * d).split(d, dim=-1)
            gate = gate.reshape(t, self.num_heads * d)
        q = self.q_norm(q.reshape(t, self.num_heads, d))
        k = self.k_norm(self.k_proj(x).view(t, self.num_kv_heads, d))
        v = self.v_proj(x).view(t, self.num_kv_heads, d)
        q = self.rotary.apply(q, ctx.cos, ctx.sin)
        k = self.rotary.apply(k, ctx.cos, ctx.sin)
        kv = PagedKV(*ctx.pool.kv.layer(self.layer_id), ctx.pool.page_table, ctx.pool.page_size)
        o = self.backend.forward(q, k, v, kv, ctx.batch, d**-0.5).reshape(t, self.num_heads * d)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o)
