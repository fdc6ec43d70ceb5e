"""The colocated MoE block: router, local experts and the optional gated shared expert.

Decoder layers only call `mlp(x)`; an attention worker swaps in a remote block with the same call.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.layers.fp8 import FP8_DTYPE, cdiv
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
    """Experts [start, start + count) in the fused layout, whatever the checkpoint's layout.

    BF16 by default; `hold_fp8` switches to the FP8 checkpoints' storage (float8_e4m3fn plus block
    scales `*_scale_inv`), with gate and up scaled as the two separate matrices they are on disk."""

    def __init__(self, start: int, count: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.start = start
        self.count = count
        self.gate_up_proj = nn.Parameter(torch.empty(count, 2 * intermediate, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(count, hidden, intermediate), requires_grad=False)
        self.gate_up_proj_scale_inv: nn.Parameter | None = None
        self.down_proj_scale_inv: nn.Parameter | None = None

    def hold_fp8(self, block: tuple[int, int], device: torch.device) -> None:
        """Replace the weights by uninitialised FP8 ones (and their scales) on `device`."""
        count, two_i, hidden = self.gate_up_proj.shape
        inter = two_i // 2

        def param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)

        self.gate_up_proj = param(count, two_i, hidden, dtype=FP8_DTYPE)
        self.down_proj = param(count, hidden, inter, dtype=FP8_DTYPE)
        self.gate_up_proj_scale_inv = param(
            count, 2 * cdiv(inter, block[0]), cdiv(hidden, block[1]), dtype=torch.float32
        )
        self.down_proj_scale_inv = param(count, cdiv(hidden, block[0]), cdiv(inter, block[1]), dtype=torch.float32)

    def scales(self) -> dict[str, torch.Tensor]:
        """The experts backend's FP8 scale arguments ({} for BF16 weights)."""
        if self.gate_up_proj_scale_inv is None:
            return {}
        return {"gate_up_scale": self.gate_up_proj_scale_inv, "down_scale": self.down_proj_scale_inv}


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
        out = self.backend.forward(
            x, self.experts.gate_up_proj, self.experts.down_proj, ids, weights, **self.experts.scales()
        )
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
