"""The colocated MoE block: router, local experts and the optional gated shared expert.

Decoder layers only call `mlp(x)`; an attention worker swaps in a remote block with the same call.

Under TP (and EP over the same ranks) every rank sees every token: the router runs whole on each
rank, the rank computes its experts' rows (its EP group's experts, its slice of their intermediate
dim) and its slice of the shared expert, and the partial sums meet in the block's one all-reduce.
No token exchange is needed: the all-reduce that TP needs anyway combines the experts' outputs.
"""
from __future__ import annotations

import torch
from torch import nn

from minisgl.kernels.activations import Activations
from minisgl.layers.fp8 import FP8_DTYPE, cdiv
from minisgl.moe.block import MoEBlock
from minisgl.moe.backend import ExpertsBackend
from minisgl.parallel.collectives import all_reduce
from minisgl.parallel.config import SINGLE, ParallelConfig


class ExpertWeights(nn.Module):
    """Experts [start, start + count) in the fused layout, whatever the checkpoint's layout, each
    holding rows [i0, i1) of its `intermediate`-wide gate and up projections and those columns of
    its down projection (the whole expert unless TP splits it).

    BF16 by default; `hold_fp8` switches to the FP8 checkpoints' storage (float8_e4m3fn plus block
    scales `*_scale_inv`), with gate and up scaled as the two separate matrices they are on disk."""

    def __init__(
        self, start: int, count: int, hidden: int, intermediate: int, inter_range: tuple[int, int] | None = None
    ) -> None:
        super().__init__()
        self.start = start
        self.count = count
        self.intermediate = intermediate
        self.inter_range = inter_range or (0, intermediate)
        local = self.inter_range[1] - self.inter_range[0]
        self.gate_up_proj = nn.Parameter(torch.empty(count, 2 * local, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(count, hidden, local), requires_grad=False)
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

    def local_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids [T, k] (-1 = padding) -> indices into these experts, -1 for the others."""
        local = ids - self.start
        return torch.where((ids >= 0) & (local >= 0) & (local < self.count), local, -1)


class LocalMoE(MoEBlock):
    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        intermediate: int,
        shared_intermediate: int,
        renormalize: bool,
        experts_backend: ExpertsBackend,
        parallel: ParallelConfig = SINGLE,
    ) -> None:
        super().__init__(hidden, num_experts, top_k, renormalize, parallel)
        start, end = parallel.expert_range(num_experts)
        self.all_experts = end - start == num_experts
        self.experts = ExpertWeights(
            start, end - start, hidden, intermediate, parallel.moe_intermediate_range(intermediate)
        )
        self.backend = experts_backend
        self.add_shared_expert(hidden, shared_intermediate)

    @property
    def reads_fp8(self) -> bool:
        return super().reads_fp8 or self.experts.gate_up_proj_scale_inv is not None

    def forward(self, x: torch.Tensor | Activations, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output for x [T, H], or `residual +` it (the decoder layer's residual add)."""
        xin = Activations.of(x)  # the shared and routed experts' one input, quantised once on FP8 weights
        weights, ids = self.route(xin)
        if not self.all_experts:
            ids = self.experts.local_ids(ids)
        # The backend adds the gated shared expert to the routed sum, and the residual where this rank's
        # output is the block's whole output (the Triton one in its combine); under TP both are partial
        # sums, so the one all-reduce still comes after the shared add, and the residual after it.
        whole = self.parallel.tp_size == 1
        out = self.backend.forward(
            xin, self.experts.gate_up_proj, self.experts.down_proj, ids, weights, **self.experts.scales(),
            shared=self.shared_addend(xin), residual=residual if whole else None,
        )
        out = all_reduce(out, self.parallel)
        return out if residual is None or whole else residual + out
