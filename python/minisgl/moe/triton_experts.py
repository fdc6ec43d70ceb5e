"""Routed-expert compute on our Triton kernels: group by expert, grouped gate/up GEMM with SwiGLU,
grouped down GEMM with the routing weight, combine (plus a colocated block's gated shared expert,
in the same pass). FP8 (block-128 scales) when the expert weights are float8_e4m3fn, BF16 otherwise.

Same call as TorchExperts (already-routed tokens in, so an expert worker uses it unchanged), plus
the FP8 scales. Every buffer is sized from T * k, so decode replays in a CUDA graph.
"""
from __future__ import annotations

import torch

from minisgl.kernels.activations import Activations
from minisgl.kernels.moe_align import ExpertGrouping, align_experts
from minisgl.kernels.moe_gemm import moe_combine, moe_down, moe_gate_up, regime
from minisgl.layers.fp8 import FP8_DTYPE
from minisgl.moe.shared_addend import SharedAddend


class TritonExperts:
    cuda_graph_safe = True

    def forward(
        self,
        x: torch.Tensor | Activations,  # [T, H]
        gate_up_proj: torch.Tensor,  # [E_local, 2I, H], gate rows first; bf16 or float8_e4m3fn
        down_proj: torch.Tensor,  # [E_local, H, I]
        local_ids: torch.Tensor,  # [T, k]; ids outside [0, E_local) are skipped
        weights: torch.Tensor,  # [T, k]
        gate_up_scale: torch.Tensor | None = None,  # [E_local, 2 * ceil(I/128), ceil(H/128)] fp32 (FP8 only)
        down_scale: torch.Tensor | None = None,  # [E_local, ceil(H/128), ceil(I/128)] fp32 (FP8 only)
        shared: SharedAddend | None = None,  # added in the combine's pass, rounded as SharedAddend.add_to
        grouping: ExpertGrouping | None = None,  # precomputed align_experts(local_ids, E_local, block_m)
        residual: torch.Tensor | None = None,  # added in the combine's pass too, as torch's `residual + out`
    ) -> torch.Tensor:
        xin = Activations.of(x)
        x = xin.x
        fp8 = gate_up_proj.dtype == FP8_DTYPE
        if fp8 != (gate_up_scale is not None) or fp8 != (down_scale is not None):
            raise ValueError("FP8 expert weights need both scales, and BF16 ones none")
        if x.shape[0] == 0:
            out = torch.empty_like(x)
            out = out if shared is None else shared.add_to(out)
            return out if residual is None else residual + out
        y, pair_rows, pending = self.expert_rows(xin, gate_up_proj, down_proj, local_ids, weights, gate_up_scale,
                                                 down_scale, grouping)
        shared_out, scale = (None, None) if shared is None else (shared.out, shared.scale())
        return moe_combine(y, local_ids, gate_up_proj.shape[0], x.dtype, shared_out, scale, residual, pair_rows, pending)

    def expert_rows(
        self, x: Activations, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, local_ids: torch.Tensor,
        weights: torch.Tensor, gate_up_scale: torch.Tensor | None, down_scale: torch.Tensor | None,
        grouping: ExpertGrouping | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(y: each routed pair's expert output; y's row of each pair, None when it is the pair's own
        t * k + j; the routing weights y still needs, None when it has them) for moe_combine."""
        num_experts = gate_up_proj.shape[0]
        g = grouping or align_experts(local_ids, num_experts, regime(local_ids.numel(), num_experts).block_m)
        h = moe_gate_up(x, gate_up_proj, gate_up_scale, g)
        return moe_down(h, down_proj, down_scale, weights, g), None, None
