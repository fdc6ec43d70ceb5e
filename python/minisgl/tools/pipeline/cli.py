"""AFD decode-step pipeline simulator: step time and per-layer-kind bubbles of the ping-pong between
attention lanes and expert workers (docs/afd_layer_imbalance.md).

    python -m minisgl.tools.pipeline --model qwen35-122b --context 8192 --batch 64 --num-mb 2 --ratio 4:4
        [--context-max 32768] [--mb-split count|context] [--fp8] [--sweep] [--png out.png]
        [--measured layer_times.json]      # per-layer costs timed on one GPU (bench_layer_times.py)
    python -m minisgl.tools.pipeline --measured DIR [--png out.png]  # an AFD run's layer-timing records

Without --measured the costs come from a roofline with H200 assumptions (tools/pipeline_costs.py).
--batch is requests per attention lane; --context-max spreads the lane's contexts from it (oldest)
down to --context. With a records directory, the step is predicted from that run's own per-layer
costs and printed next to the measured one.
"""
from __future__ import annotations

import argparse
import os

from minisgl.models.config import ModelConfig, load_config, parse_config
from minisgl.models.known_configs import hf_config, known_models
from minisgl.tools.pipeline.costs import Roofline
from minisgl.tools.pipeline.measured import summarize
from minisgl.tools.pipeline.sim import (
    EXPERT, KINDS, TAIL, StepResult, StepSpec, closed_form_applies, megascale_closed_form, simulate,
)
from minisgl.tools.pipeline.table import LayerTable
from minisgl.tools.pipeline.workload import Costs, Workload, build_spec, kinds_of, spread_contexts

ALIASES = {"qwen35-35b": "Qwen3.5-35B-A3B", "qwen35-122b": "Qwen3.5-122B-A10B", "qwen35-397b": "Qwen3.5-397B-A17B"}


def model_config(name: str, fp8: bool = False) -> ModelConfig:
    """An alias (qwen35-122b), a known model name, "tiny" (the test checkpoints' shapes), or a checkpoint
    dir; `fp8` gives a known model's FP8 checkpoint config (its quantization_config)."""
    if os.path.isdir(name):
        return load_config(name)
    if name == "tiny":
        from minisgl.models.tiny.configs import qwen35_moe_config

        return parse_config(qwen35_moe_config(8))
    if ALIASES.get(name, name) not in known_models():
        raise SystemExit(f"unknown model {name!r}: one of {', '.join([*ALIASES, *known_models(), 'tiny'])}, or a directory")
    return parse_config(hf_config(ALIASES.get(name, name), fp8))


def parse_ratio(text: str) -> tuple[int, int]:
    try:
        m, n = (int(x) for x in text.split(":"))
    except ValueError:
        raise SystemExit(f"--ratio must be M:N (attention:expert workers), got {text!r}") from None
    if m < 1 or n < 1:
        raise SystemExit(f"--ratio needs M, N >= 1, got {text!r}")
    return m, n


def _per_mb(costs: tuple[float, ...]) -> str:
    return ", ".join(f"{c:.0f}" for c in costs)


def report(spec: StepSpec, r: StepResult) -> list[str]:
    """Per layer kind: layers, per-micro-batch costs, and each side's idle time (µs, share of the step)."""
    lane = spec.lanes[0]
    lines = [f"{'kind':5} {'layers':>6} {'T_a/mb us':>16} {'shared/mb us':>13} {'T_e/mb us':>16} "
             f"{'AG idle us':>17} {'EG idle us':>17}"]
    for kind in (*KINDS, TAIL):
        n = spec.kinds.count(kind)
        if not n and kind != TAIL:
            continue
        ag, eg = r.ag_idle.get(kind, 0.0), r.eg_idle.get(kind, 0.0)
        cols = ("", "", "") if kind == TAIL else (
            _per_mb(lane.attn[kind]), _per_mb(lane.shared.get(kind, ())) or "0", _per_mb(spec.expert[kind]))
        lines.append(f"{kind:5} {n or '':>6} {cols[0]:>16} {cols[1]:>13} {cols[2]:>16} "
                     f"{ag:>9.0f} ({ag / r.step:4.0%}) {eg:>9.0f} ({eg / r.step:4.0%})")
    lines.append(f"T_c dispatch {spec.dispatch:.1f} us, combine {spec.combine:.1f} us; head {lane.head:.0f} us, "
                 f"tail {_per_mb(lane.tail) or '0'} us, finish {lane.finish:.0f} us")
    busy_ag = r.busy("attn0")
    lines.append(f"step {r.step / 1e3:.3f} ms; AG busy {busy_ag / r.step:.0%}, EG busy {r.busy(EXPERT) / r.step:.0%}")
    t_a = sum(sum(lane.attn[k]) + sum(lane.shared.get(k, ())) for k in spec.kinds) / (len(spec.kinds) * spec.num_mb)
    t_e = sum(sum(spec.expert[k]) for k in spec.kinds) / (len(spec.kinds) * spec.num_mb)
    t_c = (spec.dispatch + spec.combine) / 2
    cf = megascale_closed_form(t_a, t_e, t_c, len(spec.kinds), spec.num_mb)
    holds = "holds" if closed_form_applies(t_a, t_e, t_c, spec.num_mb) else "does not hold: the ring is too short"
    lines.append(f"MegaScale-Infer closed form at the mean T_a {t_a:.0f}, T_e {t_e:.0f} us: {cf / 1e3:.3f} ms "
                 f"(its condition {holds}; layers are not uniform, so the simulation above is the estimate)")
    return lines


def sweep(config: ModelConfig, asked: Workload, costs: Costs) -> list[str]:
    """Every num_mb in 1..4, split, and M:N over the same GPU count: step and tokens/s per GPU, best first."""
    contexts, total = asked.contexts, asked.attn_workers + asked.expert_workers
    kinds, rows = kinds_of(config.layer_types), []
    splits = ("count", "context") if len(set(contexts)) > 1 else ("count",)
    for n in range(1, total):
        if config.num_experts % n:
            continue
        for mb in range(1, min(4, len(contexts)) + 1):
            for how in splits if mb > 1 else ("count",):
                r = simulate(build_spec(kinds, Workload(contexts, mb, total - n, n, how), costs))
                tps = (total - n) * len(contexts) / (r.step / 1e6) / total
                rows.append((tps, Workload(contexts, mb, total - n, n, how), r))
    rows.sort(key=lambda x: -x[0])
    out = [f"{'M:N':>5} {'num_mb':>6} {'split':>7} {'step ms':>8} {'tok/s/GPU':>10} {'AG idle':>8} {'EG idle':>8}"]
    for tps, w, r in rows:
        mark = "  <- asked" if w == asked else ""
        mn = f"{w.attn_workers}:{w.expert_workers}"
        out.append(f"{mn:>5} {w.num_mb:>6} {w.mb_split:>7} {r.step / 1e3:>8.2f} {tps:>10.0f} "
                   f"{sum(r.ag_idle.values()) / r.step:>8.0%} {sum(r.eg_idle.values()) / r.step:>8.0%}{mark}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m minisgl.tools.pipeline", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen35-122b")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--context-max", type=int, default=None)
    ap.add_argument("--batch", type=int, default=64, help="decode requests per attention lane")
    ap.add_argument("--num-mb", type=int, default=2)
    ap.add_argument("--ratio", default="4:4", help="M:N attention:expert workers")
    ap.add_argument("--mb-split", default="count", choices=("count", "context"))
    ap.add_argument("--fp8", action="store_true", help="FP8 projection and expert weights (roofline only)")
    ap.add_argument("--measured", default=None, help="a layer-times JSON, or a directory of AFD timing records")
    ap.add_argument("--sweep", action="store_true", help="also rank num_mb, split and M:N for the same GPUs")
    ap.add_argument("--png", default=None, help="write the timeline here (needs matplotlib)")
    ns = ap.parse_args(argv)

    if ns.measured and os.path.isdir(ns.measured):
        m = summarize(ns.measured)
        spec, title = m.spec, f"{ns.measured}: {m.attn_workers}:{m.expert_workers}, num_mb {m.num_mb}, {m.steps} steps"
        result = simulate(spec)
        print(title)
        print("\n".join(report(spec, result)))
        print(f"measured step {m.step_us / 1e3:.3f} ms, predicted {result.step / 1e3:.3f} ms "
              f"(predicted / measured {result.step / m.step_us:.3f})")
        for side, meas, sim in (("AG", m.ag_wait, result.ag_idle), ("EG", m.eg_wait, result.eg_idle)):
            print(f"{side} wait by kind, measured (simulated) us: "
                  + ", ".join(f"{k} {meas.get(k, 0.0):.0f} ({sim.get(k, 0.0):.0f})" for k in KINDS))
        if m.num_mb > 1:
            for how in ("count", "context"):
                print(f"re-split {how}: predicted {simulate(m.respec(how)).step / 1e3:.3f} ms")
    else:
        config = model_config(ns.model)
        ratio = parse_ratio(ns.ratio)
        contexts = spread_contexts(ns.batch, ns.context, ns.context_max)
        roofline = Roofline(config, fp8=ns.fp8)
        costs: Costs = LayerTable.load(ns.measured, roofline) if ns.measured else roofline
        try:
            work = Workload(contexts, ns.num_mb, ratio[0], ratio[1], ns.mb_split)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        spec = build_spec(kinds_of(config.layer_types), work, costs)
        result = simulate(spec)
        span = f"{ns.context}" if ns.context_max is None else f"{ns.context_max}..{ns.context}"
        title = (f"{ns.model} {ns.ratio}, batch {ns.batch}/lane, contexts {span}, num_mb {ns.num_mb} "
                 f"({ns.mb_split} split), costs: {ns.measured or 'roofline (H200 assumptions)'}")
        print(title)
        print("\n".join(report(spec, result)))
        tps = ratio[0] * ns.batch / (result.step / 1e6) / sum(ratio)
        print(f"throughput {tps:.0f} tokens/s per GPU ({sum(ratio)} GPUs)")
        if ns.sweep:
            print("\n" + "\n".join(sweep(config, work, costs)))
    if ns.png:
        from minisgl.tools.pipeline.plot import plot_timeline

        plot_timeline(result, spec.kinds, ns.png, title)
        print(f"wrote {ns.png}")
