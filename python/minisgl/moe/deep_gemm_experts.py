"""TritonExperts with the FP8 GEMMs of prefill-sized calls on DeepGEMM (kernels/moe_deep_gemm.py):
from MIN_ROWS_PER_EXPERT rows an expert on average, with bf16 activations; decode's calls, BF16
weights and an AFD worker's precomputed grouping stay on the Triton kernels. Chosen with
--moe-backend deep_gemm; building it without the deep_gemm package, or off Hopper, is an error."""
from __future__ import annotations

import torch

from minisgl.kernels.activations import Activations
from minisgl.kernels.moe_align import ExpertGrouping
from minisgl.kernels.moe_deep_gemm import routed_experts, unavailable_reason, worth_it
from minisgl.moe.triton_experts import TritonExperts


class DeepGemmExperts(TritonExperts):
    def __init__(self) -> None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        reason = unavailable_reason(device)
        if reason is not None:
            raise RuntimeError(f"--moe-backend deep_gemm: {reason}")

    def expert_rows(
        self, x: Activations, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, local_ids: torch.Tensor,
        weights: torch.Tensor, gate_up_scale: torch.Tensor | None, down_scale: torch.Tensor | None,
        grouping: ExpertGrouping | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        if grouping is not None or not worth_it(local_ids.numel(), gate_up_proj.shape[0], x.x, gate_up_proj):
            return super().expert_rows(x, gate_up_proj, down_proj, local_ids, weights, gate_up_scale, down_scale,
                                       grouping)
        y, pair_rows = routed_experts(x, gate_up_proj, gate_up_scale, down_proj, down_scale, local_ids)
        return y, pair_rows, weights
