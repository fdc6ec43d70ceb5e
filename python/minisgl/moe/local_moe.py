"""The colocated MoE block: router, local experts and the optional gated shared expert.

Decoder layers only call `mlp(x)`; an attention worker swaps in a remote block with the same call.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.layers.linear import Linear
from minisgl.moe.router import route


class SharedExpert(nn.Module):
    """SwiGLU MLP whose output is scaled by sigmoid(x · shared_expert_gate)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate)
        self.up_proj = Linear(hidden, intermediate)
        self.down_proj = Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ExpertWeights(nn.Module):
    """Experts [start, start + count) in the fused layout, whatever the checkpoint's layout."""

    def __init__(self, start: int, count: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.start = start
        self.count = count
        self.gate_up_proj = nn.Parameter(torch.empty(count, 2 * intermediate, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(count, hidden, intermediate), requires_grad=False)


class LocalMoE(nn.Module):
    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        intermediate: int,
        shared_intermediate: int,
        renormalize: bool,
        experts_backend: object,
    ) -> None:
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize
        self.gate = Linear(hidden, num_experts)
        self.experts = ExpertWeights(0, num_experts, hidden, intermediate)
        self.backend = experts_backend
        self.shared_expert: SharedExpert | None = None
        self.shared_expert_gate: Linear | None = None
        if shared_intermediate:  # 0 = the model has no shared expert (Qwen3-MoE)
            self.shared_expert = SharedExpert(hidden, shared_intermediate)
            self.shared_expert_gate = Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        out = self.backend.forward(x, self.experts.gate_up_proj, self.experts.down_proj, ids, weights)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
