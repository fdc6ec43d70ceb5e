"""Event-driven model of one AFD decode step (the ping-pong of afd/attention_worker.py and
afd/expert_worker.py), with per-layer costs that depend on the layer's kind.

Each attention lane (AG) runs, in order: its head (embeddings), then for every layer l and
micro-batch i an item that starts once layer l-1's combine for i is back, computes `attn` (norms,
mixer, router), sends the dispatch and computes `shared` (the shared expert, after the send);
then per micro-batch the last combine and its `tail` (final norm, lm_head); then `finish`
(sampling). The expert workers (EG; the N of them are symmetric, so one timeline) run the items
in the same (l, i) order; an item starts once every lane's dispatch has arrived (M:N fan-in).
Transfers take `dispatch` and `combine` µs each way and never contend.

Bubbles: an AG's wait before item (l, i) is charged to layer l-1 (it waits on that layer's
experts); the EG's wait before (l, i) to layer l (it waits on that layer's attention). Waits at
the end of the step (the EG after its last item; a lane that finished before the slowest) are
charged to "tail".
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

GDN, FULL = "gdn", "full"
KINDS = (GDN, FULL)
TAIL = "tail"
EXPERT = "expert"


def lane_name(a: int) -> str:
    return f"attn{a}"


@dataclass(frozen=True)
class LaneCosts:
    """One attention lane's compute in µs. attn and shared map a layer kind to one cost per micro-batch."""

    attn: dict[str, tuple[float, ...]]
    shared: dict[str, tuple[float, ...]] = field(default_factory=dict)  # after the send; none = 0
    head: float = 0.0
    tail: tuple[float, ...] = ()  # per micro-batch; none = 0
    finish: float = 0.0


@dataclass(frozen=True)
class StepSpec:
    kinds: tuple[str, ...]  # per layer: GDN or FULL
    num_mb: int
    lanes: tuple[LaneCosts, ...]  # M
    expert: dict[str, tuple[float, ...]]  # per layer kind, per micro-batch: one expert worker's compute
    dispatch: float  # µs, AG -> EG
    combine: float  # µs, EG -> AG

    def __post_init__(self) -> None:
        if self.num_mb < 1 or not self.lanes or not self.kinds:
            raise ValueError("a step needs >= 1 micro-batch, lane and layer")
        if set(self.kinds) - set(KINDS):
            raise ValueError(f"layer kinds must be in {KINDS}, got {sorted(set(self.kinds) - set(KINDS))}")
        tables = [("expert", self.expert)]
        for a, lane in enumerate(self.lanes):
            tables += [(f"{lane_name(a)}.attn", lane.attn), (f"{lane_name(a)}.shared", lane.shared)]
            if lane.tail and len(lane.tail) != self.num_mb:
                raise ValueError(f"{lane_name(a)}.tail has {len(lane.tail)} entries for {self.num_mb} micro-batches")
        for name, table in tables:
            for kind, costs in table.items():
                if len(costs) != self.num_mb or min(costs) < 0:
                    raise ValueError(f"{name}[{kind}] needs {self.num_mb} costs >= 0, got {costs}")
        for kind in set(self.kinds):
            if kind not in self.expert or any(kind not in lane.attn for lane in self.lanes):
                raise ValueError(f"no attention or expert cost for the {kind} layers")
        if self.dispatch < 0 or self.combine < 0:
            raise ValueError("transfer times must be >= 0")


@dataclass(frozen=True)
class Span:
    who: str  # lane_name(a) or EXPERT
    layer: int  # -1 = before layer 0; len(kinds) = after the last layer
    mb: int  # -1 = the whole step
    what: str  # "head", "attn", "shared", "expert", "tail", "finish", or "idle"
    start: float
    end: float


@dataclass(frozen=True)
class StepResult:
    step: float  # µs, until the slowest lane finishes
    spans: tuple[Span, ...]
    ag_idle: dict[str, float]  # per layer kind (and TAIL): idle µs, averaged over the lanes
    eg_idle: dict[str, float]  # per layer kind (and TAIL)

    def busy(self, who: str) -> float:
        return sum(s.end - s.start for s in self.spans if s.who == who and s.what != "idle")


def simulate(spec: StepSpec) -> StepResult:
    L, m, kinds = len(spec.kinds), spec.num_mb, spec.kinds
    spans: list[Span] = []
    ag_idle: list[dict[str, float]] = [defaultdict(float) for _ in spec.lanes]
    eg_idle: dict[str, float] = defaultdict(float)

    def run(who: str, layer: int, mb: int, what: str, start: float, cost: float) -> float:
        if cost > 0:
            spans.append(Span(who, layer, mb, what, start, start + cost))
        return start + cost

    def wait(who: str, layer: int, mb: int, free: float, ready: float, idle: dict[str, float], charge: str) -> float:
        if ready > free:
            spans.append(Span(who, layer, mb, "idle", free, ready))
            idle[charge] += ready - free
        return max(free, ready)

    ag = [run(lane_name(a), -1, -1, "head", 0.0, lane.head) for a, lane in enumerate(spec.lanes)]
    eg = 0.0
    back: dict[int, float] = {}  # micro-batch -> when its latest combine reaches the lanes
    for l, kind in enumerate(kinds):
        for i in range(m):
            sent = []
            for a, lane in enumerate(spec.lanes):
                who = lane_name(a)
                t = wait(who, l, i, ag[a], back.get(i, 0.0), ag_idle[a], kinds[l - 1] if l else kind)
                t = run(who, l, i, "attn", t, lane.attn[kind][i])
                sent.append(t)
                ag[a] = run(who, l, i, "shared", t, lane.shared.get(kind, (0.0,) * m)[i])
            t = wait(EXPERT, l, i, eg, max(sent) + spec.dispatch, eg_idle, kind)
            eg = run(EXPERT, l, i, "expert", t, spec.expert[kind][i])
            back[i] = eg + spec.combine
    for i in range(m):
        for a, lane in enumerate(spec.lanes):
            t = wait(lane_name(a), L, i, ag[a], back[i], ag_idle[a], kinds[-1])
            ag[a] = run(lane_name(a), L, i, "tail", t, lane.tail[i] if lane.tail else 0.0)
    ag = [run(lane_name(a), L, -1, "finish", ag[a], lane.finish) for a, lane in enumerate(spec.lanes)]
    step = max(ag)
    for a in range(len(spec.lanes)):
        wait(lane_name(a), L, -1, ag[a], step, ag_idle[a], TAIL)
    wait(EXPERT, L, -1, eg, step, eg_idle, TAIL)
    keys = set().union(*ag_idle)
    mean_ag = {k: sum(d.get(k, 0.0) for d in ag_idle) / len(ag_idle) for k in keys}
    return StepResult(step, tuple(spans), mean_ag, dict(eg_idle))


def megascale_closed_form(t_a: float, t_e: float, t_c: float, num_layers: int, num_mb: int) -> float:
    """MegaScale-Infer's ping-pong step time for uniform layers: (T_a + T_e + 2T_c) + T_f(mL - 1),
    T_f = max(T_a, T_e). It holds when `closed_form_applies`."""
    return t_a + t_e + 2 * t_c + max(t_a, t_e) * (num_mb * num_layers - 1)


def closed_form_applies(t_a: float, t_e: float, t_c: float, num_mb: int) -> bool:
    """The slower side never starves: the other m-1 micro-batches cover one round trip of the faster
    side and both transfers ((m-1)·T_f >= 2T_c + min(T_a, T_e); MegaScale-Infer's m·T_f >= 2(T_f + T_c)
    when T_a = T_e)."""
    return (num_mb - 1) * max(t_a, t_e) >= 2 * t_c + min(t_a, t_e)
