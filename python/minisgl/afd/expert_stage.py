"""What an expert worker holds: per MoE layer, its slice of the routed experts (named like the
full model's params, so the loader's expert filter fills them from any checkpoint layout)."""
from __future__ import annotations

import torch
from torch import nn

from minisgl.models.config import ModelConfig
from minisgl.moe.backend import ExpertsBackend
from minisgl.moe.local_moe import ExpertWeights


class ExpertStage(nn.Module):
    """One layer's experts [start, start + count): routed rows in, weighted partial sums out."""

    def __init__(self, config: ModelConfig, start: int, count: int, backend: ExpertsBackend) -> None:
        super().__init__()
        self.experts = ExpertWeights(start, count, config.hidden_size, config.moe_intermediate_size)
        self.backend = backend

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, H], global expert ids [T, k] (-1 = padding), weights [T, k] -> [T, H]."""
        return self.backend.forward(
            x, self.experts.gate_up_proj, self.experts.down_proj, self.experts.local_ids(ids), weights.to(x.dtype),
            **self.experts.scales()
        )


class _Layer(nn.Module):
    def __init__(self, stage: ExpertStage) -> None:
        super().__init__()
        self.mlp = stage


class ExpertShard(nn.Module):
    """layers.{i}.mlp.experts.* for every layer: the expert worker's whole model."""

    def __init__(self, config: ModelConfig, start: int, count: int, backend: ExpertsBackend) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(ExpertStage(config, start, count, backend)) for _ in range(config.num_layers))

    def stage(self, layer: int) -> ExpertStage:
        return self.layers[layer].mlp
