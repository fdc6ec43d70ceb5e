"""The contract every full-attention backend keeps (the torch reference and the Triton kernels)."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from minisgl.attention.paged_kv import PagedKV
from minisgl.forward_batch import ForwardBatch


@runtime_checkable
class AttentionBackend(Protocol):
    # True when a decode step reads only device tensors (no host sync, no per-step Python shapes),
    # so a captured CUDA graph replays it correctly; the engine captures decode graphs only then.
    cuda_graph_safe: bool

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: PagedKV, batch: ForwardBatch, scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Store the step's new k, v [T, Hkv, D] in `kv` at batch.cache_loc, then causal attention of
        q [T, Hq, D] over each request's cached prefix and new tokens -> [T, Hq, D] in q's dtype,
        written into `out` when given (a piecewise graph's static buffer) and returned."""
        ...
