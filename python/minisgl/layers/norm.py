"""RMSNorm variants. The rounding order mirrors the reference so bf16 runs stay bit-close.

CUDA inputs run the fused Triton kernels (kernels/rms_norm.py, same rounding order); the torch
functions here are the CPU path and the kernels' reference. Triton is imported only on CUDA: CPU
installs have none.

A norm whose readers are FP8 projections (`fp8_output`, set by the layer that owns it once the
dtypes are final: models/materialize.py) returns, on CUDA, Activations carrying the output's codes,
written in the norm's own pass, so none of those readers quantises it again."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernels.activations import Activations
from minisgl.kernels.fp8_format import rows_split_into_groups
from minisgl.layers.row_pieces import RowPieces, assembled


def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    """zero_centered (Qwen3.5): y = norm(x)·(1 + w), computed in fp32.
    plain (Qwen3): y = w · norm(x), with norm(x) rounded to the input dtype first."""
    if zero_centered:
        return (_normalize(x, eps) * (1.0 + weight.float())).to(x.dtype)
    return weight * _normalize(x, eps).to(x.dtype)


def gated_rms_norm_torch(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: w · norm(x) · silu(gate), with a plain (not 1 + w) weight."""
    y = weight * _normalize(x, eps).to(x.dtype)
    return (y * F.silu(gate.float())).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, zero_centered: bool) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.fp8_output = False

    def feed_fp8(self, readers_fp8: bool) -> None:
        """Called by the owner once the dtypes are final: whether a reader of the output quantises it
        (an FP8 projection). Rows of a width that is not a multiple of 128 keep the quantiser's pass."""
        self.fp8_output = readers_fp8 and rows_split_into_groups((1, self.weight.shape[0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor | Activations:
        if x.is_cuda:
            from minisgl.kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps, self.zero_centered, quantise=self.fp8_output)
        return rms_norm_torch(x, self.weight, self.eps, self.zero_centered)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | Activations]:
        """(h, norm(h)) for the residual sum h = x + delta; one launch on CUDA."""
        if x.is_cuda:
            from minisgl.kernels.rms_norm import add_rms_norm

            return add_rms_norm(x, delta, self.weight, self.eps, self.zero_centered, quantise=self.fp8_output)
        h = x + delta
        return h, self(h)


class GatedRMSNorm(nn.Module):
    """Over each head's rows of [T, heads, dim]; the output is [T, heads * dim], a token a row."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.fp8_output = False

    def feed_fp8(self, readers_fp8: bool) -> None:
        """As RMSNorm.feed_fp8: heads of a width that is not a multiple of 128 keep the quantiser's pass."""
        self.fp8_output = readers_fp8 and rows_split_into_groups((1, self.weight.shape[0]))

    def forward(self, x: torch.Tensor | RowPieces, gate: torch.Tensor) -> torch.Tensor | Activations:
        """x [T, heads, dim], or its rows in pieces (read in place on CUDA); gate [T, heads, dim]."""
        if gate.is_cuda:
            from minisgl.kernels.rms_norm import gated_rms_norm_runs

            runs = x.runs if isinstance(x, RowPieces) else ((x, 0),)
            y = gated_rms_norm_runs(runs, gate, self.weight, self.eps, quantise=self.fp8_output)
            return y if isinstance(y, Activations) else y.view(gate.shape[0], -1)
        return gated_rms_norm_torch(assembled(x), gate, self.weight, self.eps).reshape(gate.shape[0], -1)
