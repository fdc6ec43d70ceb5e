"""What every layer of one forward step reads: the batch, the pools, the backends and the rotary tables."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.attention.backend import AttentionBackend
from minisgl.forward_batch import ForwardBatch
from minisgl.gdn.backend import GDNBackend
from minisgl.kvcache.hybrid_pool import HybridPool
from minisgl.moe.backend import ExpertsBackend


@dataclass(frozen=True)
class Backends:
    """One backend object per family; each keeps its family's Protocol (attention/, gdn/, moe/ backend.py)."""

    attention: AttentionBackend
    gdn: GDNBackend
    moe: ExpertsBackend

    def graph_unsafe(self) -> list[str]:
        """The backends whose decode cannot be replayed from a captured CUDA graph."""
        return [type(b).__name__ for b in (self.attention, self.gdn, self.moe) if not b.cuda_graph_safe]


@dataclass(frozen=True)
class ForwardContext:
    batch: ForwardBatch
    pool: HybridPool
    cos: torch.Tensor  # [T, rotary_dim]
    sin: torch.Tensor
