"""What every layer of one forward step reads: the batch, the pools, the backends and the rotary tables,
and how the mixers' batch-dependent cores run (directly, or between piecewise CUDA graphs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from minisgl.attention.backend import AttentionBackend
from minisgl.forward_batch import ForwardBatch
from minisgl.gdn.backend import GDNBackend
from minisgl.kvcache.hybrid_pool import HybridPool
from minisgl.layers.row_pieces import RowPieces
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


class CoreRunner(Protocol):
    """Runs a mixer's core: `fn(ctx, *tensors, out=None)`, whose inputs and output have one row per
    token; given `out` (a runner's buffer of the output's shape), the core writes its output there,
    else it may return its rows as RowPieces (layers/row_pieces.py) for its mixer to read."""

    def __call__(self, fn: Callable[..., torch.Tensor], ctx: "ForwardContext", *tensors: torch.Tensor) -> torch.Tensor:
        ...


def run_core(fn: Callable[..., torch.Tensor], ctx: "ForwardContext", *tensors: torch.Tensor) -> torch.Tensor:
    """The eager step: the core is a plain call."""
    return fn(ctx, *tensors)


@dataclass(frozen=True)
class ForwardContext:
    batch: ForwardBatch
    pool: HybridPool
    cos: torch.Tensor  # [T, rotary_dim]
    sin: torch.Tensor
    cores: CoreRunner = run_core

    def mixer_core(self, fn: Callable[..., torch.Tensor | RowPieces], *tensors: torch.Tensor) -> torch.Tensor | RowPieces:
        """The part of a token mixer that reads the batch's per-request metadata or the pool
        (attention over the pages, the conv and the delta rule over the state slots): fn(self,
        *tensors). Everything else in a step depends on the token count alone, which is what lets
        engine/piecewise_graph.py capture it in CUDA graphs and run only the cores eagerly."""
        return self.cores(fn, self, *tensors)
