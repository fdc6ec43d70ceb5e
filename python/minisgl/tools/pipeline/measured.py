"""AFD layer-timing records (afd/layer_timing.py) -> measured per-layer costs, the waits each side saw,
the transfer time, the measured step, and a StepSpec the simulator can predict that step from.

Per attention-lane item (l, i): its compute is "combined" -> "dispatched" (mixer, router, send,
shared expert), and its wait is "previous mark" -> "combined". Per expert item: its compute is
"received" -> "sent" (experts, send), its wait "previous mark" -> "received". The combine's sum of
partials and the receive's unpacking fall in the waits: a few µs, not told apart.
Transfers (T_c each way) are the 10th percentile of the message times (see _transfers).

Costs are means over steps and layers of a kind (a step sums many items, so its mean is the sum
of their means: medians would under-predict under a skewed noise such as a shared CPU's), and so
is the measured step.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from minisgl.afd.mb_split import split
from minisgl.tools.pipeline.sim import FULL, LaneCosts, StepSpec
from minisgl.tools.pipeline.workload import kinds_of

_FIRST = {"attn": "combined", "expert": "received"}  # an item's first mark: its wait ends there


@dataclass(frozen=True)
class _Record:
    """One worker's step: its marks in µs, and each item's gap (previous mark -> its first mark)."""

    worker: str
    step: int
    origin_us: float | None  # "begin" on the host's monotonic clock (CPU records only)
    at: dict[tuple[int, int, str], float]
    gap: dict[tuple[int, int], float]
    contexts: tuple[tuple[int, ...], ...]  # each micro-batch's request contexts (attention records)

    def abs(self, key: tuple[int, int, str]) -> float:
        return self.origin_us + self.at[key]


def _decode(r: dict[str, Any]) -> _Record:
    at, gap, prev = {}, {}, 0.0
    for l, mb, name, us in r["marks"]:
        at[(l, mb, name)] = us
        if name == _FIRST[r["role"]]:
            gap[(l, mb)] = us - prev
        prev = us
    origin = r.get("origin_ns")
    contexts = tuple(tuple(c) for c in r.get("contexts", ()))
    return _Record(r["worker"], r["step"], None if origin is None else origin / 1e3, at, gap, contexts)


@dataclass(frozen=True)
class Measured:
    kinds: tuple[str, ...]
    num_mb: int
    attn_workers: int
    expert_workers: int
    steps: int  # decode steps measured
    step_us: float  # mean over steps of the slowest lane's launch span
    spec: StepSpec  # mean per-item costs, for the simulator
    ag_wait: dict[str, float]  # per layer kind, charged as the simulator charges idle; mean over lanes
    eg_wait: dict[str, float]
    contexts: tuple[tuple[int, ...], ...]  # each micro-batch's request contexts, of the last step
    full_fit: tuple[float, float]  # (a, b): a full-attention item's µs ~ a + b·(its micro-batch's context)

    def respec(self, mb_split: str) -> StepSpec:
        """The spec with the last step's requests split `mb_split`-wise: the split keeps the sizes, so
        only the full-attention items change, to full_fit of their new contexts."""
        flat = [c for mb in self.contexts for c in mb]
        a, b = self.full_fit
        full = tuple(a + b * sum(mb) for mb in split(flat, flat, self.num_mb, mb_split))
        lanes = tuple(
            LaneCosts({**lane.attn, FULL: full}, lane.shared, lane.head, lane.tail, lane.finish)
            for lane in self.spec.lanes
        )
        s = self.spec
        return StepSpec(s.kinds, s.num_mb, lanes, s.expert, s.dispatch, s.combine)


def load_records(path: str, skip: int = 2, where: Callable[[dict], bool] | None = None) -> tuple[list[dict], list[dict]]:
    """(attention, expert) records of the decode steps in `path`, after the first `skip` of them
    (warm-up), keeping only steps every worker recorded and, given `where`, whose attention
    records all satisfy it."""
    recs = []
    for f in sorted(glob.glob(os.path.join(path, "step*.json"))):
        with open(f) as fh:
            recs.append(json.load(fh))
    if not recs:
        raise FileNotFoundError(f"no layer-timing records (step*.json) in {path!r}")
    workers = {r["worker"] for r in recs}
    by_step: dict[int, list[dict]] = defaultdict(list)
    for r in recs:
        by_step[r["step"]].append(r)
    steps = sorted(
        s for s, rs in by_step.items()
        if len(rs) == len(workers) and all(r["decode"] and (where is None or r["role"] != "attn" or where(r)) for r in rs)
    )
    keep = set(steps[skip:])
    if not keep:
        raise ValueError(f"{path!r} holds no complete decode step after skipping {skip}")
    kept = [r for r in recs if r["step"] in keep]
    return [r for r in kept if r["role"] == "attn"], [r for r in kept if r["role"] == "expert"]


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line; a flat one when the xs do not vary."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return my - slope * mx, slope


def _by_worker(recs: list[dict]) -> dict[str, list[_Record]]:
    out: dict[str, list[_Record]] = defaultdict(list)
    for r in recs:
        out[r["worker"]].append(_decode(r))
    return out


def _low(xs: list[float]) -> float:
    """The 10th percentile, at least 0: waiting for a busy receiver only adds to a transfer's time,
    so a low quantile is a transfer that found its receiver ready."""
    return max(0.0, sorted(xs)[len(xs) // 10])


def _transfers(
    lanes: dict[str, list[_Record]], experts: dict[str, list[_Record]], busy: dict[tuple[int, int, int], float],
    num_layers: int,
) -> tuple[float, float]:
    """(dispatch, combine) µs. On the CPU the marks share the host's monotonic clock: dispatched ->
    received, and sent -> combined. On GPUs, from round trips on one lane: (dispatched(l, i) ->
    combined(l + 1, i) - expert compute) / 2, so no clocks of two devices are ever compared."""
    ags = [x for xs in lanes.values() for x in xs]
    egs = [x for xs in experts.values() for x in xs]
    items = [(x, l, i) for x in ags for l, i in x.gap if l < num_layers]
    if all(x.origin_us is not None for x in ags + egs):
        by_step: dict[int, list[_Record]] = defaultdict(list)
        for e in egs:
            by_step[e.step].append(e)
        there = [e.abs((l, i, "received")) - x.abs((l, i, "dispatched")) for x, l, i in items for e in by_step[x.step]]
        back = [x.abs((l + 1, i, "combined")) - e.abs((l, i, "sent")) for x, l, i in items for e in by_step[x.step]]
        return _low(there), _low(back)
    t_c = _low([(x.at[(l + 1, i, "combined")] - x.at[(l, i, "dispatched")] - busy[(x.step, l, i)]) / 2 for x, l, i in items])
    return t_c, t_c


def summarize(path: str, skip: int = 2, where: Callable[[dict], bool] | None = None) -> Measured:
    attn_recs, expert_recs = load_records(path, skip, where)
    first = attn_recs[0]
    kinds = kinds_of(first["layer_types"])
    L, m = len(kinds), len(first["mb_tokens"])
    lanes, experts = _by_worker(attn_recs), _by_worker(expert_recs)

    lane_specs, ag_wait, fit_x, fit_y = [], defaultdict(list), [], []
    for w, xs in lanes.items():
        samples: dict[tuple[str, int], list[float]] = defaultdict(list)
        waits: dict[str, list[float]] = defaultdict(list)
        for x in xs:
            per_step: dict[str, float] = defaultdict(float)
            for (l, i), gap in x.gap.items():
                if l > 0:  # waited for layer l-1's experts
                    per_step[kinds[l - 1]] += gap
                if l == L:
                    continue
                cost = x.at[(l, i, "dispatched")] - x.at[(l, i, "combined")]
                samples[(kinds[l], i)].append(cost)
                if kinds[l] == FULL:
                    fit_x.append(sum(x.contexts[i]))
                    fit_y.append(cost)
            for k, v in per_step.items():
                waits[k].append(v)
        for k, v in waits.items():
            ag_wait[k].append(_mean(v))
        last_logits = [max(v for k, v in x.at.items() if k[2] == "logits") for x in xs]
        lane_specs.append(LaneCosts(
            {k: tuple(_mean(samples[(k, i)]) for i in range(m)) for k in set(kinds)},
            head=_mean([x.at[(-1, -1, "embedded")] for x in xs]),
            tail=tuple(_mean([x.at[(L, i, "logits")] - x.at[(L, i, "combined")] for x in xs]) for i in range(m)),
            finish=_mean([x.at[(-1, -1, "end")] - t for x, t in zip(xs, last_logits)]),
        ))

    expert_samples: dict[tuple[str, int], list[float]] = defaultdict(list)
    eg_wait: dict[str, list[float]] = defaultdict(list)
    busy: dict[tuple[int, int, int], float] = {}  # (step, l, i) -> the slowest expert worker's compute
    for w, xs in experts.items():
        for x in xs:
            per_step: dict[str, float] = defaultdict(float)
            for (l, i), gap in x.gap.items():
                cost = x.at[(l, i, "sent")] - x.at[(l, i, "received")]
                expert_samples[(kinds[l], i)].append(cost)
                per_step[kinds[l]] += gap
                busy[(x.step, l, i)] = max(busy.get((x.step, l, i), 0.0), cost)
            for k, v in per_step.items():
                eg_wait[k].append(v)

    dispatch, combine = _transfers(lanes, experts, busy, L)
    expert = {k: tuple(_mean(expert_samples[(k, i)]) for i in range(m)) for k in set(kinds)}
    spans: dict[int, float] = defaultdict(float)
    for xs in lanes.values():
        for x in xs:
            spans[x.step] = max(spans[x.step], x.at[(-1, -1, "end")])
    last = max(lanes[first["worker"]], key=lambda x: x.step)
    return Measured(
        kinds=kinds, num_mb=m, attn_workers=first["attn_workers"], expert_workers=first["expert_workers"],
        steps=len(spans), step_us=_mean(list(spans.values())),
        spec=StepSpec(kinds, m, tuple(lane_specs), expert, dispatch, combine),
        ag_wait={k: _mean(v) for k, v in ag_wait.items()},
        eg_wait={k: _mean(v) for k, v in eg_wait.items()},
        contexts=last.contexts,
        full_fit=_fit(fit_x, fit_y) if fit_x else (0.0, 0.0),
    )
