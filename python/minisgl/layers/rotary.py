"""Rotary position embedding on the first `rotary_dim` dims of each head (rotate-half layout).

For text-only input Qwen3.5's interleaved M-RoPE has equal position ids on all three axes, so it
reduces to this plain 1-D RoPE.

On CUDA, `apply_normed` fuses attention's per-head q/k norm with the rotation into one Triton launch
(kernels/qk_norm_rope.py, same rounding chain); the torch code here is the CPU path and its reference.
"""
from __future__ import annotations

import torch

from minisgl.layers.norm import RMSNorm


class RotaryEmbedding:
    def __init__(self, rotary_dim: int, theta: float) -> None:
        self.rotary_dim = rotary_dim
        self.theta = theta

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # The frequencies are made where the positions live, per call: the model may be built on
        # the meta device, and a host-to-device copy here would break CUDA-graph capture.
        dims = torch.arange(0, self.rotary_dim, 2, dtype=torch.float32, device=positions.device)
        inv_freq = 1.0 / (self.theta ** (dims / self.rotary_dim))
        freqs = positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; cos/sin: [T, rotary_dim]."""
        rd = self.rotary_dim
        rot, rest = x[..., :rd], x[..., rd:]
        half = rd // 2
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        out = rot * cos[:, None, :] + rotated * sin[:, None, :]
        return torch.cat([out, rest], dim=-1)

    def apply_normed(self, x: torch.Tensor, norm: RMSNorm, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """apply(norm(x), cos, sin) for x [T, heads, head_dim], read in place (a strided view is not
        copied); one launch on CUDA."""
        if x.is_cuda:
            from minisgl.kernels.qk_norm_rope import norm_rope

            return norm_rope(x, norm.weight, cos, sin, norm.eps, norm.zero_centered, self.rotary_dim)
        return self.apply(norm(x), cos, sin)
