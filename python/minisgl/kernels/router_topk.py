"""MoE routing in one launch: fp32 softmax over the experts, top-k, optional renormalisation.

One program per token row. Experts fill a masked power-of-two block (any count, e.g. 60 or 512);
top-k is k rounds of "take the max, then mask it out", so the picks come out in descending order as
torch.topk's do (exactly equal probabilities may pick a different expert than torch).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _router_topk_kernel(
    logits_ptr, weights_ptr, ids_ptr, stride_logits, stride_weights, stride_ids, experts,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + row * stride_logits + e, mask=e < experts, other=float("-inf"))
    logits = logits.to(tl.float32)
    ex = tl.exp(logits - tl.max(logits, axis=0))
    probs = ex / tl.sum(ex, axis=0)
    # Probabilities are >= 0, so -1 keeps padding columns (and already chosen experts) out of the max.
    probs = tl.where(e < experts, probs, -1.0)
    k = tl.arange(0, BLOCK_K)
    top_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    top_id = tl.zeros([BLOCK_K], dtype=tl.int64)
    for i in tl.static_range(TOP_K):
        best_w, best = tl.max(probs, axis=0, return_indices=True)
        top_w = tl.where(k == i, best_w, top_w)
        top_id = tl.where(k == i, best.to(tl.int64), top_id)
        probs = tl.where(e == best, -1.0, probs)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)
    tl.store(weights_ptr + row * stride_weights + k, top_w.to(weights_ptr.dtype.element_ty), mask=k < TOP_K)
    tl.store(ids_ptr + row * stride_ids + k, top_id, mask=k < TOP_K)


def router_topk(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    weights: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] in the logits dtype, expert ids [T, k] int64), descending."""
    rows, experts = logits.shape
    if not 0 < top_k <= experts:
        raise ValueError(f"top_k={top_k} must be in [1, {experts}]")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    weights = torch.empty(rows, top_k, dtype=logits.dtype, device=logits.device) if weights is None else weights
    ids = torch.empty(rows, top_k, dtype=torch.int64, device=logits.device) if ids is None else ids
    if weights.shape != (rows, top_k) or ids.shape != (rows, top_k) or weights.stride(1) != 1 or ids.stride(1) != 1:
        raise ValueError(f"weights and ids must be [{rows}, {top_k}] with a unit-stride last dim")
    if rows == 0:
        return weights, ids
    block_e = triton.next_power_of_2(experts)
    _router_topk_kernel[(rows,)](
        logits, weights, ids, logits.stride(0), weights.stride(0), ids.stride(0), experts,
        TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_E=block_e, BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=max(1, min(4, block_e // 256)),
    )
    return weights, ids
