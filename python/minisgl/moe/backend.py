"""The contract every routed-expert backend keeps (the torch reference and the Triton grouped GEMMs).

The input is already routed, so one call serves a colocated MoE block and an AFD expert worker."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from minisgl.moe.shared_addend import SharedAddend
from minisgl.kernels.activations import Activations


@runtime_checkable
class ExpertsBackend(Protocol):
    # True when the forward reads only device tensors (no host sync on the routing), so a captured
    # CUDA graph replays it correctly.
    cuda_graph_safe: bool

    def forward(
        self,
        x: torch.Tensor | Activations,  # [T, H]; Activations to share its FP8 quantisation with other layers
        gate_up_proj: torch.Tensor,  # [E_local, 2I, H], gate rows first; bf16/fp32 or float8_e4m3fn
        down_proj: torch.Tensor,  # [E_local, H, I]
        local_ids: torch.Tensor,  # [T, k]; ids outside [0, E_local) are skipped (another rank's experts)
        weights: torch.Tensor,  # [T, k]
        gate_up_scale: torch.Tensor | None = None,  # FP8 weights: block scales (ExpertWeights.scales())
        down_scale: torch.Tensor | None = None,
        shared: SharedAddend | None = None,  # a colocated block's shared expert; None on an expert worker
        residual: torch.Tensor | None = None,  # [T, H]: the residual stream, when the block's output is whole here
    ) -> torch.Tensor:
        """sum over k of weights * expert(x) for this rank's experts -> [T, H] in x's dtype, then
        `shared.add_to` of that (rounded exactly as its torch ops round; the dtype theirs), then
        `residual +` that, as torch adds them."""
        ...
