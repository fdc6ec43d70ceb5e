"""Linear layers that read one input, their weights stacked row-wise in one storage, so that one GEMM
computes them all: one launch and one pass over the input instead of one per layer (the shared
expert's gate and up projections, attention's q, k and v, GDN's b and a). In a decode step a GEMM
costs ~9 us whatever its few rows (benchmarks/bench_decode_linear.py), so layers that share their
input pay that once. Each output is a column block of the GEMM's [T, sum of rows] output: its rows
are strided, and the readers take it in place.

Each layer keeps its params, under their checkpoint names, as views of the stack, so the loader and
the dummy initialiser fill them in place as they fill any linear layer, a TP rank's shard and FP8
block scales included. The stack is made while the model is still on the meta device
(models/materialize.py), in the dtypes the weights will be held in.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernels.activations import Activations, tensor
from minisgl.layers.fp8_linear import KERNEL_BLOCK, Fp8Linear
from minisgl.layers.linear import Linear


class RowStack:
    """The stacked weights (and FP8 block scales) of some layers; called, it gives each one's output."""

    def __init__(self, layers: Sequence[Linear | Fp8Linear], device: torch.device) -> None:
        if not row_stack_fits(layers):
            raise ValueError("RowStack: layers of one kind, input width and (FP8) whole 128-row blocks, on meta")
        self.rows = [layer.weight.shape[0] for layer in layers]
        self.weight = _stack(layers, "weight", device)
        self.scale = _stack(layers, "weight_scale_inv", device) if isinstance(layers[0], Fp8Linear) else None

    def __call__(self, x: torch.Tensor | Activations) -> list[torch.Tensor]:
        return list(self.output(x).split(self.rows, dim=-1))

    def output(self, x: torch.Tensor | Activations) -> torch.Tensor:
        """The one GEMM's output [..., sum of rows]: the layers' outputs side by side."""
        if self.scale is None:
            return F.linear(tensor(x), self.weight)
        from minisgl.kernels.fp8_linear import fp8_linear  # here: CPU installs have no triton

        return fp8_linear(x, self.weight, self.scale)


def layer_outputs(stack: RowStack | None, layers: Sequence[nn.Module],
                  x: torch.Tensor | Activations) -> list[torch.Tensor]:
    """Each layer's output for input x: through the stack where the layers have one, else one by one."""
    return stack(x) if stack is not None else [layer(x) for layer in layers]


def row_stack_fits(layers: Sequence[Linear | Fp8Linear]) -> bool:
    """Whether `layers` can share one stack: all still on meta, of one class, dtype and input width,
    and, held in FP8, each of whole 128-row blocks (a block scale must not cover two layers' rows)."""
    first = layers[0]
    if any(type(layer) is not type(first) or layer.weight.dtype != first.weight.dtype
           or layer.weight.shape[1] != first.weight.shape[1] or not layer.weight.is_meta for layer in layers):
        return False
    return not isinstance(first, Fp8Linear) or all(layer.weight.shape[0] % KERNEL_BLOCK[0] == 0 for layer in layers)


def _stack(layers: Sequence[nn.Module], name: str, device: torch.device) -> torch.Tensor:
    """One storage for every layer's param `name`, each layer's param rebound to its rows of it."""
    params = [getattr(layer, name) for layer in layers]
    stack = torch.empty(sum(p.shape[0] for p in params), *params[0].shape[1:], dtype=params[0].dtype, device=device)
    start = 0
    for layer, p in zip(layers, params):
        setattr(layer, name, nn.Parameter(stack[start : start + p.shape[0]], requires_grad=False))
        start += p.shape[0]
    return stack
