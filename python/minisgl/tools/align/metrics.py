"""Teacher-forced alignment metrics: how the reference model ranks each token the candidate chose.

A candidate that computes the same function as the reference picks the reference's top-1 at every
greedy step, so its tokens have rank 1 and their logprob is the reference's best. Ranks grow (and
top-10 hits drop) as soon as the candidate's numerics or weights drift.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class TokenScore:
    """One generated token as the reference sees it."""

    token_id: int  # the candidate's token
    logprob: float  # its logprob under the reference
    rank: int  # its rank under the reference; 1 = the reference's own top-1
    ref_top1: int  # the reference's top-1 token at this position


@dataclass(frozen=True)
class Metrics:
    tokens: int
    top1: float  # share of tokens that are the reference's top-1
    top10: float  # share with rank <= 10
    top100: float
    mean_rank: float
    max_rank: int
    mean_logprob: float
    perplexity: float  # exp(-mean_logprob): the reference's perplexity on the candidate's tokens
    # 0-based position in the completion of the first token that is not the reference's top-1
    # (over all prompts: the earliest); None when every token is.
    first_non_top1: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _first_non_top1(scores: Sequence[TokenScore]) -> int | None:
    return next((i for i, s in enumerate(scores) if s.rank != 1), None)


def metrics(scores: Sequence[TokenScore]) -> Metrics:
    if not scores:
        raise ValueError("no generated tokens to score")
    n = len(scores)
    mean_lp = sum(s.logprob for s in scores) / n
    return Metrics(
        tokens=n,
        top1=sum(s.rank == 1 for s in scores) / n,
        top10=sum(s.rank <= 10 for s in scores) / n,
        top100=sum(s.rank <= 100 for s in scores) / n,
        mean_rank=sum(s.rank for s in scores) / n,
        max_rank=max(s.rank for s in scores),
        mean_logprob=mean_lp,
        perplexity=math.exp(-mean_lp),
        first_non_top1=_first_non_top1(scores),
    )


def overall(per_prompt: Sequence[Sequence[TokenScore]]) -> Metrics:
    """Token-weighted over every prompt; first_non_top1 is the earliest over the prompts."""
    pooled = metrics([s for scores in per_prompt for s in scores])
    firsts = [f for f in (_first_non_top1(scores) for scores in per_prompt) if f is not None]
    return Metrics(**{**asdict(pooled), "first_non_top1": min(firsts) if firsts else None})


@dataclass(frozen=True)
class Gates:
    min_top1: float = 0.0
    min_top10: float = 1.0

    def failures(self, m: Metrics) -> list[str]:
        out = []
        if m.top1 < self.min_top1:
            out.append(f"top-1 agreement {m.top1:.4f} < --min-top1 {self.min_top1}")
        if m.top10 < self.min_top10:
            out.append(f"top-10 hit rate {m.top10:.4f} < --min-top10 {self.min_top10}")
        return out
