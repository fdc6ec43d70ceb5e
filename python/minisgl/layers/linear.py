"""Bias-free linear layer whose weight the loader fills (no random init: real weights always follow).

A tensor-parallel layer holds its rank's rows (column-parallel) or columns (row-parallel) of the
checkpoint's weight; `shard` says which, so the loader reads only those. Row-parallel outputs are
partial sums: the mixer or MoE block that owns the layer all-reduces once for all of them."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernels.activations import Activations, tensor
from minisgl.parallel.shard import Shard


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, shard: Shard | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        if shard is not None:
            if shard.shape != (out_features, in_features):
                raise ValueError(f"shard {shard} does not give a [{out_features}, {in_features}] weight")
            self.shards = {"weight": shard}

    def forward(self, x: torch.Tensor | Activations) -> torch.Tensor:
        return F.linear(tensor(x), self.weight)


def column_parallel(in_features: int, out_features: int, *rows: tuple[int, int]) -> Linear:
    """The rows `rows` (ranges of the full [out_features, in_features] weight) of a linear layer; the
    whole layer when no range is given."""
    if not rows:
        return Linear(in_features, out_features)
    shard = Shard.along((out_features, in_features), 0, *rows)
    return Linear(in_features, shard.shape[0], shard)


def row_parallel(in_features: int, out_features: int, *cols: tuple[int, int]) -> Linear:
    """The input columns `cols` of a linear layer (its output is then a partial sum)."""
    if not cols:
        return Linear(in_features, out_features)
    shard = Shard.along((out_features, in_features), 1, *cols)
    return Linear(shard.shape[1], out_features, shard)
