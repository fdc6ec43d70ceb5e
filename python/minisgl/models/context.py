"""What every layer of one forward step reads: the batch, the pools, the backends and the rotary tables."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import HybridPool


@dataclass(frozen=True)
class Backends:
    attention: object
    gdn: object
    moe: object


@dataclass(frozen=True)
class ForwardContext:
    batch: ForwardBatch
    pool: HybridPool
    cos: torch.Tensor  # [T, rotary_dim]
    sin: torch.Tensor
