"""Rotary position embedding on the first `rotary_dim` dims of each head (rotate-half layout).

For text-only input Qwen3.5's interleaved M-RoPE has equal position ids on all three axes, so it
reduces to this plain 1-D RoPE.
"""
from __future__ import annotations

import torch


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
