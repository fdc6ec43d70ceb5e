"""CPU validation of the AFD pipeline simulator, and the micro-batch split mitigation, in one run.

AFD 1+1 on the CPU with layer timing on (--afd-layer-timing-dir), in scenarios where per-layer
costs are controlled: heavy routed experts (the expert side is slow), long contexts (the
full-attention layers are slow), each with num_mb 1 and 2; and mixed contexts with the oldest
requests the longest (the count split puts them in one micro-batch), num_mb 2, where one run
alternates --afd-mb-split count and context step by step, so both see the same machine load (a
shared CPU's load drifts more between runs than the split changes a step). For each: the measured
decode step (mean launch span of the attention worker) next to the simulator's prediction from
the same steps' per-layer costs; for the context split, also the prediction made from the
count-split steps alone.

    python benchmarks/bench_afd_imbalance.py [--steps 16] [--keep DIR] [--only mixed]

Prints a markdown table; writes afd_imbalance.json under $OUT when set. Each scenario's timing
records stay under --keep for `python -m minisgl.tools.pipeline --measured DIR --png out.png`.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import asdict, dataclass, replace

import torch

from minisgl.afd.args import AfdArgs
from minisgl.afd.coordinator import Coordinator
from minisgl.afd.mb_split import split
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.args import SchedulerArgs
from minisgl.scheduler.messages import GenerateRequest
from minisgl.models.tiny.make import make_tiny_model
from minisgl.tools.pipeline.measured import Measured, summarize
from minisgl.tools.pipeline.sim import simulate


@dataclass(frozen=True)
class Scenario:
    name: str
    moe_intermediate: int
    prompts: tuple[int, ...]  # prompt lengths in admission order
    runs: tuple[tuple[int, str], ...]  # (num_mb, mb_split); "alternate" = count and context, step by step


BATCH = 16
SCENARIOS = (
    Scenario("heavy experts", 2048, (32,) * BATCH, ((1, "count"), (2, "count"))),
    Scenario("long context", 64, (3000,) * BATCH, ((1, "count"), (2, "count"))),
    Scenario("mixed context", 4096, tuple(2000 - 130 * i for i in range(BATCH)), ((2, "alternate"),)),
)


@dataclass(frozen=True)
class Row:
    scenario: str
    num_mb: int
    mb_split: str
    measured_ms: float
    predicted_ms: float
    ag_wait_ms: dict[str, float]
    sim_ag_idle_ms: dict[str, float]
    eg_wait_ms: dict[str, float]
    sim_eg_idle_ms: dict[str, float]
    t_c_us: float
    steps: int
    predicted_before_ms: float | None = None  # the context split, predicted from the count-split run

    @property
    def ratio(self) -> float:
        return self.predicted_ms / self.measured_ms


def run_afd(model: str, sc: Scenario, num_mb: int, mb_split: str, steps: int, timing_dir: str) -> None:
    args = EngineArgs(model_path=model, device="cpu", dtype="float32", context_length=4096, page_size=64,
                      chunked_prefill_size=4096, max_running_requests=BATCH)
    alternate = mb_split == "alternate"
    afd = AfdArgs(num_mb=num_mb, async_pending_steps=1, mb_split="count" if alternate else mb_split,
                  layer_timing_dir=timing_dir)
    coord = Coordinator(resolve_plan(args), afd, sched_args=SchedulerArgs(max_prefill_tokens=sum(sc.prompts)))
    try:
        params = SamplingParams(temperature=0, max_tokens=(2 if alternate else 1) * steps + 3, ignore_eos=True)
        g = torch.Generator().manual_seed(0)
        for i, n in enumerate(sc.prompts):
            coord.add_request(GenerateRequest(f"r{i}", tuple(torch.randint(1, 500, (n,), generator=g).tolist()), params))
        while coord.has_work:
            if alternate:  # the coordinator reads the split at each step's planning
                coord.afd = replace(coord.afd, mb_split="context" if coord.afd.mb_split == "count" else "count")
            coord.step()
    finally:
        coord.close()


def split_of(record: dict) -> str:
    """Which split planned this attention record's step."""
    mbs = [list(c) for c in record["contexts"]]
    flat = [c for mb in mbs for c in mb]
    return "context" if mbs == split(flat, flat, len(mbs), "context") else "count"


def _ms(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v / 1e3, 2) for k, v in sorted(d.items())}


def row(sc: Scenario, num_mb: int, mb_split: str, m: Measured, before: float | None) -> Row:
    sim = simulate(m.spec)
    return Row(sc.name, num_mb, mb_split, m.step_us / 1e3, sim.step / 1e3, _ms(m.ag_wait), _ms(sim.ag_idle),
               _ms(m.eg_wait), _ms(sim.eg_idle), round(m.spec.dispatch, 1), m.steps, before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16, help="decode steps per run")
    ap.add_argument("--keep", default=None, help="keep each run's timing records under this directory")
    ap.add_argument("--only", default=None, help="run only the scenarios whose name contains this")
    ns = ap.parse_args()
    torch.set_num_threads(1)
    root = ns.keep or tempfile.mkdtemp(prefix="afd-imbalance-")
    rows: list[Row] = []
    for sc in SCENARIOS:
        if ns.only and ns.only not in sc.name:
            continue
        model = os.path.join(root, f"model-{sc.moe_intermediate}")
        if not os.path.exists(os.path.join(model, "config.json")):
            make_tiny_model(model, overrides={"moe_intermediate_size": sc.moe_intermediate})
        for num_mb, how in sc.runs:
            timing = os.path.join(root, f"{sc.name.replace(' ', '-')}-mb{num_mb}-{how}")
            run_afd(model, sc, num_mb, how, ns.steps, timing)
            if how == "alternate":
                base = summarize(timing, where=lambda r: split_of(r) == "count")
                mitigated = summarize(timing, where=lambda r: split_of(r) == "context")
                rows.append(row(sc, num_mb, "count", base, None))
                rows.append(row(sc, num_mb, "context", mitigated, simulate(base.respec("context")).step / 1e3))
            else:
                rows.append(row(sc, num_mb, how, summarize(timing), None))
            for r in rows[-2 if how == "alternate" else -1:]:
                print(f"{sc.name} mb={num_mb} {r.mb_split}: measured {r.measured_ms:.2f} ms, "
                      f"predicted {r.predicted_ms:.2f} ms ({r.ratio:.3f})", flush=True)
    print("\n| scenario | num_mb | split | measured ms | predicted ms | pred/meas | AG wait ms (sim) | EG wait ms (sim) | T_c µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ag = ", ".join(f"{k} {v} ({r.sim_ag_idle_ms.get(k, 0.0)})" for k, v in r.ag_wait_ms.items())
        eg = ", ".join(f"{k} {v} ({r.sim_eg_idle_ms.get(k, 0.0)})" for k, v in r.eg_wait_ms.items())
        print(f"| {r.scenario} | {r.num_mb} | {r.mb_split} | {r.measured_ms:.2f} | {r.predicted_ms:.2f} | "
              f"{r.ratio:.3f} | {ag} | {eg} | {r.t_c_us} |")
    for r in rows:
        if r.predicted_before_ms is not None:
            print(f"\n{r.scenario}: context split predicted from the count-split run: {r.predicted_before_ms:.2f} ms; "
                  f"measured {r.measured_ms:.2f} ms ({r.predicted_before_ms / r.measured_ms:.3f})")
    print(f"\ntiming records: {root}")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "afd_imbalance.json"), "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
