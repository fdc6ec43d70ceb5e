"""Token sampling from fp32 logits: greedy, or temperature / top-k / top-p with per-request generators.

All sampled rows are filtered in one batched pass, and each generator draws once for all its rows
(unseeded requests share one), so a step costs a handful of kernels rather than a few per request.
"""
from __future__ import annotations

import torch

from minisgl.host_copy import to_device
from minisgl.sampling_params import SamplingParams


def _filter(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row, mask logits outside its top_k (ties kept) and outside the smallest set whose
    probability reaches its top_p. logits [R, V]; top_k [R] (V = off); top_p [R] (inf = off)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    kth = sorted_logits.gather(1, (top_k - 1)[:, None])
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = sorted_logits.softmax(-1)
    # Drop a token when the mass before it already reaches top_p; the top token always stays
    # (explicitly: a top_p that rounds to 0 in fp32 would otherwise drop it too).
    drop = (probs.cumsum(-1) - probs) >= top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """logits [B, V] fp32 -> one token id per row."""
    return sample_tensor(logits, params, generators).tolist()


def sample_tensor(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """Like sample, but [B] int64 on the logits' device and without a host sync, so the overlap
    loop can feed the tokens into the next step before the CPU has seen them."""
    out = torch.argmax(logits, dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    vocab, dev = logits.shape[-1], logits.device
    hot = [params[i] for i in rows]
    temperature = to_device([p.temperature for p in hot], torch.float32, dev)
    top_k = to_device([p.top_k if 0 < p.top_k < vocab else vocab for p in hot], torch.int64, dev)
    top_p = to_device([p.top_p if p.top_p < 1 else float("inf") for p in hot], torch.float32, dev)
    probs = _filter(logits[rows] / temperature[:, None], top_k, top_p).softmax(-1)
    by_generator: dict[int, list[int]] = {}
    for j, i in enumerate(rows):
        by_generator.setdefault(id(generators[i]), []).append(j)
    picked = torch.empty(len(rows), dtype=torch.int64, device=dev)
    for js in by_generator.values():
        picked[js] = torch.multinomial(probs[js], 1, generator=generators[rows[js[0]]])[:, 0]
    out[rows] = picked
    return out
