"""Gated DeltaNet token mixer: projections, causal conv, gated delta rule, gated RMSNorm, out_proj.

Per-request conv and SSM state live in the StatePool and are updated in place by the backend.
"""
from __future__ import annotations

import torch
from torch import nn

from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.layers.linear import Linear
from minisgl.layers.norm import GatedRMSNorm
from minisgl.models.config import ModelConfig
from minisgl.models.context import ForwardContext


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, backend: object) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.k_dim = config.linear_key_head_dim
        self.v_dim = config.linear_value_head_dim
        h = config.hidden_size
        self.in_proj_qkv = Linear(h, config.conv_dim)  # rows: q, k, v
        self.in_proj_z = Linear(h, config.linear_value_dim)
        self.in_proj_b = Linear(h, self.num_v_heads)
        self.in_proj_a = Linear(h, self.num_v_heads)
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(
            torch.empty(config.conv_dim, 1, config.linear_conv_kernel_dim), requires_grad=False
        )
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads), requires_grad=False)
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = Linear(config.linear_value_dim, h)
        self.backend = backend

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        batch, t = ctx.batch, x.shape[0]
        conv_state, ssm_state = ctx.pool.state.layer(self.layer_id)
        weight = self.conv1d.weight[:, 0, :]
        qkv = self.in_proj_qkv(x)
        if batch.is_decode:
            qkv = self.backend.conv_decode(qkv, weight, conv_state, batch.slots)
        else:
            qkv = self.backend.conv_prefill(qkv, weight, batch.cu_seqlens, conv_state, batch.slots)
        kd = self.num_k_heads * self.k_dim
        q = qkv[:, :kd].reshape(t, self.num_k_heads, self.k_dim)
        k = qkv[:, kd : 2 * kd].reshape(t, self.num_k_heads, self.k_dim)
        v = qkv[:, 2 * kd :].reshape(t, self.num_v_heads, self.v_dim)
        inp = DeltaInputs(q, k, v, self.in_proj_a(x), self.in_proj_b(x), self.A_log, self.dt_bias)
        if batch.is_decode:
            o = self.backend.delta_decode(inp, ssm_state, batch.slots)
        else:
            o = self.backend.delta_prefill(inp, batch.cu_seqlens, ssm_state, batch.slots)
        z = self.in_proj_z(x).reshape(t * self.num_v_heads, self.v_dim)
        o = self.norm(o.reshape(t * self.num_v_heads, self.v_dim), z)
        return self.out_proj(o.reshape(t, self.num_v_heads * self.v_dim))
