"""The MoE block hands its gated shared expert to the experts backend (SharedAddend) instead of adding
it itself: on the CPU reference backend the block's output must stay bit for bit what the block's
own ops gave before, routed + sigmoid(shared_expert_gate(x)) * shared_expert(x), in fp32 and bf16."""
from __future__ import annotations

import pytest
import torch

from minisgl.moe.local_moe import LocalMoE
from minisgl.moe.torch_experts import TorchExperts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_local_moe_output_is_unchanged(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    block = LocalMoE(64, 8, 2, 32, 48, renormalize=True, experts_backend=TorchExperts())
    for p in block.parameters():
        p.data = torch.randn_like(p) / p.shape[-1] ** 0.5
    block.to(dtype)
    x = torch.randn(9, 64).to(dtype)

    weights, ids = block.route(x)
    routed = block.backend.forward(x, block.experts.gate_up_proj, block.experts.down_proj, ids, weights)
    before = routed + torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    assert torch.equal(block(x), before)
    assert torch.equal(routed + block.shared(x), before)  # the gated output an AFD attention worker adds
