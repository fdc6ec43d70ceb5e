"""Logprobs of chosen tokens under the model's raw distribution (before temperature and top-k/p,
as vLLM reports them), with each token's rank and the top-k alternatives."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from minisgl.scheduler.messages import TokenLogprob


@dataclass(frozen=True)
class LogprobTensors:
    logprob: torch.Tensor  # [R] fp32
    rank: torch.Tensor  # [R] int64, 1 = most likely
    top_ids: torch.Tensor  # [R, k]
    top_logprobs: torch.Tensor  # [R, k]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "LogprobTensors":
        return LogprobTensors(fn(self.logprob), fn(self.rank), fn(self.top_ids), fn(self.top_logprobs))


# Rows per log-softmax pass: each row's fp32 copy of the vocabulary is 1 MB at 248K tokens.
_ROWS_PER_PASS = 64


def compute_logprobs(logits: torch.Tensor, targets: torch.Tensor, k: int) -> LogprobTensors:
    """logits [R, V], targets [R] -> the targets' logprobs, ranks and the top-k; stays on the device."""
    parts = [_logprobs(logits[i : i + _ROWS_PER_PASS], targets[i : i + _ROWS_PER_PASS], k)
             for i in range(0, max(1, logits.shape[0]), _ROWS_PER_PASS)]
    if len(parts) == 1:
        return parts[0]
    return LogprobTensors(*(torch.cat(ts) for ts in zip(*(
        (p.logprob, p.rank, p.top_ids, p.top_logprobs) for p in parts))))


def _logprobs(logits: torch.Tensor, targets: torch.Tensor, k: int) -> LogprobTensors:
    lsm = torch.log_softmax(logits.float(), dim=-1)
    lp = lsm.gather(1, targets[:, None].long())[:, 0]
    rank = (lsm > lp[:, None]).sum(dim=-1) + 1
    top = lsm.topk(k, dim=-1)
    return LogprobTensors(lp, rank, top.indices, top.values)


def to_entries(t: LogprobTensors, targets: list[int], ks: list[int]) -> list[TokenLogprob]:
    """Host tensors -> one TokenLogprob per row, row i keeping its own top ks[i]."""
    lps, ranks = t.logprob.tolist(), t.rank.tolist()
    ids, vals = t.top_ids.tolist(), t.top_logprobs.tolist()
    return [
        TokenLogprob(tok, lp, rank, tuple(zip(ids[i][:k], vals[i][:k])))
        for i, (tok, lp, rank, k) in enumerate(zip(targets, lps, ranks, ks))
    ]
