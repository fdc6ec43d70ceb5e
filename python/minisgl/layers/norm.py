"""RMSNorm variants. The rounding order mirrors the reference so bf16 runs stay bit-close.

CUDA inputs run the fused Triton kernels (kernels/rms_norm.py, same rounding order); the torch
functions here are the CPU path and the kernels' reference. Triton is imported only on CUDA: CPU
installs have none."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from minisgl.kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps, self.zero_centered)
        return rms_norm_torch(x, self.weight, self.eps, self.zero_centered)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, norm(h)) for the residual sum h = x + delta; one launch on CUDA."""
        if x.is_cuda:
            from minisgl.kernels.rms_norm import add_rms_norm

            return add_rms_norm(x, delta, self.weight, self.eps, self.zero_centered)
        h = x + delta
        return h, self(h)


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from minisgl.kernels.rms_norm import gated_rms_norm

            return gated_rms_norm(x, gate, self.weight, self.eps)
        return gated_rms_norm_torch(x, gate, self.weight, self.eps)
