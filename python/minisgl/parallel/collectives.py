"""The collectives of a tensor-parallel step, each a no-op at TP 1 (no launch, no copy).

Per layer a sharded step issues one all-reduce per token mixer and one per MoE block; per step one
broadcast of the input ids (TP rank 0 knows the sampled tokens), one all-reduce of the embedding
and one all-gather of the logits. All of them are capturable in a CUDA graph on NCCL.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from minisgl.parallel.config import ParallelConfig

# all_gather_into_tensor was renamed in newer torch; the GPU image may carry an older one.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_reduce(x: torch.Tensor, pc: ParallelConfig) -> torch.Tensor:
    """Sum of x over the TP ranks, in place."""
    if pc.tp_size > 1:
        dist.all_reduce(x, group=pc.group)
    return x


def gather_last_dim(x: torch.Tensor, pc: ParallelConfig) -> torch.Tensor:
    """[R, n] on each rank -> [R, tp * n], rank order along the last dim (vocabulary-parallel logits)."""
    if pc.tp_size == 1:
        return x
    rows, n = x.shape
    out = torch.empty(pc.tp_size * rows, n, dtype=x.dtype, device=x.device)
    _all_gather_single(out, x.contiguous(), group=pc.group)
    return out.view(pc.tp_size, rows, n).permute(1, 0, 2).reshape(rows, pc.tp_size * n)


def broadcast_from_leader(x: torch.Tensor, pc: ParallelConfig) -> torch.Tensor:
    """x of TP rank 0 on every rank, in place."""
    if pc.tp_size > 1:
        dist.broadcast(x, src=pc.leader, group=pc.group)
    return x


def max_over_ranks(values: list[int], pc: ParallelConfig, device: torch.device) -> list[int]:
    """Element-wise max of small host integers over the TP ranks (on `device`: NCCL reduces only
    device tensors)."""
    if pc.tp_size == 1:
        return values
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pc.group)
    return t.tolist()
