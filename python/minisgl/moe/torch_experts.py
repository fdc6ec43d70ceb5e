"""Reference routed-expert compute: a loop over the experts that received tokens.

The input is already routed (ids, weights), so the same call serves a local MoE block and an
expert worker receiving tokens from attention workers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchExperts:
    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        gate_up_proj: torch.Tensor,  # [E_local, 2I, H], gate rows first
        down_proj: torch.Tensor,  # [E_local, H, I]
        local_ids: torch.Tensor,  # [T, k] int64; ids outside [0, E_local) are skipped
        weights: torch.Tensor,  # [T, k]
    ) -> torch.Tensor:
        out = torch.zeros_like(x)
        num_local = gate_up_proj.shape[0]
        hit = torch.unique(local_ids)
        for e in hit[(hit >= 0) & (hit < num_local)].tolist():
            tok, slot = torch.nonzero(local_ids == e, as_tuple=True)
            gate, up = F.linear(x[tok], gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, down_proj[e]) * weights[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out
