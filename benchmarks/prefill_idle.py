"""Where the GPU idles inside back-to-back prefill steps: the gaps between kernels on the device's
timeline, and which of them came from a launch the host made late.

    python benchmarks/prefill_idle.py [--model Qwen3.5-122B-A10B] [--layers 24] [--step 2x8192]
        [--steps 3] [--host-profile]

Runs `--steps` eager steps back to back (as the server's overlap loop enqueues them) under
torch.profiler, after three untimed ones, and reads the exported trace:
- span (first kernel start to last kernel end), kernel time, idle;
- idle after a late launch: the next kernel's launch call began after the kernel before it ended,
  so the device waited on the host (the rest is the boundary between kernels);
- idle by (the CPU op that launched the next kernel -> that kernel), and the largest gaps.
With --host-profile, first prefill_steps.host_profile of one step: its synchronising calls and
cProfile's top functions. The step's engine is prefill_steps.step_engine's (dummy FP8 weights).
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass

import torch

from prefill_steps import MODEL, PrefillStep, allocate_step, host_profile, step_engine

KERNELS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHES = ("cuda_runtime", "cuda_driver")


def innermost_op(cpu_ops: list[dict], starts: list[float], ts: float) -> str:
    """The shortest CPU op around time ts ('?' outside any: a Triton launch from Python)."""
    best = None
    for e in cpu_ops[max(0, bisect.bisect_right(starts, ts) - 400) : bisect.bisect_right(starts, ts)]:
        if e["ts"] <= ts <= e["ts"] + e["dur"] and (best is None or e["dur"] < best["dur"]):
            best = e
    return best["name"] if best else "?"


@dataclass(frozen=True)
class Idle:
    """The device timeline's idle between kernels (us), from a trace's events."""

    span: float  # first kernel start to last kernel end
    idle: float  # time in no kernel (overlapping kernels counted once)
    late: float  # of it, before kernels whose launch call began after the kernels before them ended
    kernels: int
    by_op: Counter  # "launching op -> next kernel" -> idle before that kernel
    gaps: list[tuple[float, str, str, str, bool]]  # (idle, kernel before, kernel after, launching op, late)


def idle_between_kernels(events: list[dict]) -> Idle:
    gpu = sorted([e for e in events if e.get("cat") in KERNELS], key=lambda e: e["ts"])
    launch = {e["args"]["correlation"]: e for e in events
              if e.get("cat") in LAUNCHES and "correlation" in e.get("args", {})}
    cpu_ops = sorted([e for e in events if e.get("cat") == "cpu_op"], key=lambda e: e["ts"])
    starts = [e["ts"] for e in cpu_ops]
    idle = late = 0.0
    by_op, gaps = Counter(), []
    end, prev = gpu[0]["ts"] + gpu[0]["dur"], gpu[0]
    for e in gpu[1:]:
        gap = e["ts"] - end
        if gap > 0:
            call = launch.get(e.get("args", {}).get("correlation"))
            is_late = call is not None and call["ts"] >= end
            op = innermost_op(cpu_ops, starts, call["ts"]) if call else "?"
            idle += gap
            late += gap if is_late else 0.0
            by_op[f"{op} -> {e['name'][:60]}"] += gap
            gaps.append((gap, prev["name"][:50], e["name"][:50], op, is_late))
        if e["ts"] + e["dur"] >= end:
            end, prev = e["ts"] + e["dur"], e
    return Idle(end - gpu[0]["ts"], idle, late, len(gpu), by_op, gaps)


def report(r: Idle, top: int = 20) -> str:
    lines = [f"span {r.span / 1e3:.1f} ms, kernels {(r.span - r.idle) / 1e3:.1f} ms, idle {r.idle / 1e3:.1f} ms "
             f"({r.idle / r.span:.1%}) over {r.kernels} kernels; after a late launch {r.late / 1e3:.1f} ms",
             "idle by (launching op -> next kernel), ms:"]
    lines += [f"  {v / 1e3:7.2f}  {k}" for k, v in r.by_op.most_common(top)]
    lines.append("largest gaps (us | kernel before | kernel after | launching op | launch late):")
    lines += [f"  {g:8.1f} | {a} | {b} | {op} | {is_late}" for g, a, b, op, is_late in sorted(r.gaps, reverse=True)[:top]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL, help="a known config (models/known_configs.py)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the config's (default: all)")
    ap.add_argument("--step", default="2x8192", help="'BxN' or 'BxN@P', as bench_prefill.py's --steps")
    ap.add_argument("--steps", type=int, default=3, help="steps enqueued back to back under the profiler")
    ap.add_argument("--host-profile", action="store_true")
    args = ap.parse_args()
    step = PrefillStep.parse(args.step)
    engine = step_engine(args.model, args.layers, [step])
    slots, seqs = allocate_step(engine, step)
    batch = engine.make_batch(seqs, [step.prefix] * step.requests, slots)
    for _ in range(3):  # compiles, autotuning, the allocator's first blocks
        engine.forward_batch(batch)
    torch.cuda.synchronize()
    if args.host_profile:
        print(host_profile(engine, batch))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.forward_batch(batch)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    print(f"{step}, {engine.config.num_layers} layers, {args.steps} steps back to back on "
          f"{torch.cuda.get_device_name()}:\n{report(idle_between_kernels(events))}")


if __name__ == "__main__":
    main()
