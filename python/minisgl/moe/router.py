"""Softmax top-k routing with optional renormalisation of the chosen probabilities.

CUDA logits run the one-launch Triton kernel (kernels/router_topk.py); `route_torch` is the CPU
path and its reference. Triton is imported only on CUDA: CPU installs have none."""
from __future__ import annotations

import torch


def route_torch(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax runs in fp32: at 256-512 experts bf16 probabilities tie and flip the top-k."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (weights [T, k] in the logits dtype, expert ids [T, k] int64), in descending order."""
    if router_logits.is_cuda:
        from minisgl.kernels.router_topk import router_topk

        return router_topk(router_logits, top_k, renormalize)
    return route_torch(router_logits, top_k, renormalize)
