"""RMSNorm variants. The rounding order mirrors the reference so bf16 runs stay bit-close."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """zero_centered (Qwen3.5): y = norm(x)·(1 + w), computed in fp32.
    plain (Qwen3): y = w · norm(x), with norm(x) rounded to the input dtype first."""

    def __init__(self, dim: int, eps: float, zero_centered: bool) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.zero_centered:
            return (_normalize(x, self.eps) * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * _normalize(x, self.eps).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """GDN output norm: w · norm(o) · silu(z), with a plain (not 1 + w) weight."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        y = self.weight * _normalize(x, self.eps).to(x.dtype)
        return (y * F.silu(gate.float())).to(x.dtype)
