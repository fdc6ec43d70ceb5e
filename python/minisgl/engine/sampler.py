"""Token sampling from fp32 logits: greedy, or temperature / top-k / top-p with per-request generators."""
from __future__ import annotations

import torch

from minisgl.sampling_params import SamplingParams


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k and outside the smallest set whose probability reaches top_p."""
    if top_k != -1 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p; the top token always stays.
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop[0] = False  # explicitly: a top_p that rounds to 0 in fp32 would otherwise drop it too
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


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
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = _filter(logits[i] / p.temperature, p.top_k, p.top_p)
        probs = row.softmax(-1)
        out[i] = torch.multinomial(probs, 1, generator=generators[i])[0]
    return out
