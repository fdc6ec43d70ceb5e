"""Linear layer holding its weight as the FP8 checkpoints do: float8_e4m3fn plus one fp32 scale per
128x128 block (`weight_scale_inv`, names as on disk). GPU only: the forward is the block-scaled
Triton GEMM, which quantises activations per token in 128-wide groups (once for all the layers that
read one Activations)."""
from __future__ import annotations

import torch
from torch import nn

from minisgl.kernels.activations import Activations
from minisgl.layers.fp8 import FP8_DTYPE, cdiv

KERNEL_BLOCK = (128, 128)  # the only block the GEMM implements (that of every official FP8 checkpoint)


class Fp8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, block: tuple[int, int] = KERNEL_BLOCK) -> None:
        super().__init__()
        if tuple(block) != KERNEL_BLOCK:
            raise ValueError(f"FP8 weight block {tuple(block)} is not supported on the GPU (only {KERNEL_BLOCK})")
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8_DTYPE), requires_grad=False)
        self.weight_scale_inv = nn.Parameter(
            torch.empty(cdiv(out_features, block[0]), cdiv(in_features, block[1]), dtype=torch.float32),
            requires_grad=False,
        )

    def forward(self, x: torch.Tensor | Activations) -> torch.Tensor:
        # Imported here: CPU installs have no triton (they may still build and load this layer).
        from minisgl.kernels.fp8_linear import fp8_linear

        return fp8_linear(x, self.weight, self.weight_scale_inv)
