"""Reference routed-expert compute: a loop over the experts that received tokens.

The input is already routed (ids, weights), so the same call serves a local MoE block and an
expert worker receiving tokens from attention workers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.kernels.activations import Activations, tensor
from minisgl.layers.fp8 import dequantize_block_fp8, dequantize_gate_up
from minisgl.moe.shared_addend import SharedAddend


class TorchExperts:
    cuda_graph_safe = False  # picks the experts that received tokens on the host

    def forward(
        self,
        x: torch.Tensor | Activations,  # [T, H]
        gate_up_proj: torch.Tensor,  # [E_local, 2I, H], gate rows first
        down_proj: torch.Tensor,  # [E_local, H, I]
        local_ids: torch.Tensor,  # [T, k] int64; ids outside [0, E_local) are skipped
        weights: torch.Tensor,  # [T, k]
        gate_up_scale: torch.Tensor | None = None,  # FP8 weights: block scales (ExpertWeights.scales())
        down_scale: torch.Tensor | None = None,
        shared: SharedAddend | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = tensor(x)
        out = torch.zeros_like(x)
        num_local = gate_up_proj.shape[0]
        hit = torch.unique(local_ids)
        for e in hit[(hit >= 0) & (hit < num_local)].tolist():
            tok, slot = torch.nonzero(local_ids == e, as_tuple=True)
            w13, w2 = gate_up_proj[e], down_proj[e]
            if gate_up_scale is not None:  # FP8: dequantise the one expert (a reference, not a fast path)
                w13 = dequantize_gate_up(w13, gate_up_scale[e], dtype=x.dtype)
                w2 = dequantize_block_fp8(w2, down_scale[e], dtype=x.dtype)
            gate, up = F.linear(x[tok], w13).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, w2) * weights[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        out = out if shared is None else shared.add_to(out)
        return out if residual is None else residual + out
