"""Measured per-layer costs (benchmarks/bench_layer_times.py's JSON, one GPU, real shapes) as the
simulator's cost model: piecewise-linear in batch, context and tokens between the measured points
(and linearly extended beyond them). Transfers are not measurable on one GPU: they come from the
roofline's link model."""
from __future__ import annotations

import json
from bisect import bisect_left
from collections import defaultdict
from typing import Any

from minisgl.tools.pipeline.costs import Roofline


def interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear through sorted (xs, ys), extended linearly past the ends; never below 0."""
    if len(xs) == 1:
        return ys[0]
    j = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _curve(points: list[list[float]]) -> tuple[list[float], list[float]]:
    pts = sorted(points)
    return [p[0] for p in pts], [p[-1] for p in pts]


class LayerTable:
    def __init__(self, table: dict[str, Any], links: Roofline) -> None:
        self.expert_workers = table["expert_workers"]
        self.links = links
        # kind -> context -> (batches, µs)
        self._attn: dict[str, dict[float, tuple[list[float], list[float]]]] = {}
        for kind, rows in table["attn"].items():
            by_ctx: dict[float, list[list[float]]] = defaultdict(list)
            for batch, ctx, us in rows:
                by_ctx[ctx].append([batch, us])
            self._attn[kind] = {c: _curve(pts) for c, pts in by_ctx.items()}
        self._1d = {name: _curve(table[name]) for name in ("shared", "head", "tail", "expert")}

    @classmethod
    def load(cls, path: str, links: Roofline) -> "LayerTable":
        with open(path) as f:
            return cls(json.load(f), links)

    def attn(self, kind: str, batch: int, context: int) -> float:
        """At the micro-batch's mean context: a full-attention layer's time follows its total KV."""
        by_ctx = self._attn[kind]
        ctxs = sorted(by_ctx)
        at_ctx = [interp(*by_ctx[c], batch) for c in ctxs]
        return interp(ctxs, at_ctx, context / batch)

    def shared(self, batch: int) -> float:
        return interp(*self._1d["shared"], batch)

    def head(self, batch: int) -> float:
        return interp(*self._1d["head"], batch)

    def tail(self, batch: int) -> float:
        return interp(*self._1d["tail"], batch)

    def expert(self, tokens: int, expert_workers: int) -> float:
        if expert_workers != self.expert_workers:
            raise ValueError(f"the table timed the experts of 1/{self.expert_workers} of the experts; "
                             f"rerun bench_layer_times.py --expert-workers {expert_workers}")
        return interp(*self._1d["expert"], tokens)

    def transfers(self, batch: int, attn_workers: int, expert_workers: int) -> tuple[float, float]:
        return self.links.transfers(batch, attn_workers, expert_workers)
