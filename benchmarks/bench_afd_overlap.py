"""Does micro-batch ping-pong overlap the two roles? AFD 1+1 on the CPU, decode steps of a model
whose routed experts are made deliberately heavy (wide moe_intermediate_size), with num_mb 1
(serialized) and 2 (ping-pong) in one run. Prints the per-step time of each, their ratio, and the
pickled size of one step's plans.

    python benchmarks/bench_afd_overlap.py [--batch 128] [--steps 16] [--moe-intermediate 1536]

Keep the experts' weights cache-resident (the default 1536 gives 19 MB per layer in fp32): ping-pong
runs each layer's experts once per micro-batch, so when a layer's weights spill out of the last-level
cache the second pass re-reads them from memory and mb=2 loses, as it does on a GPU at small batch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from minisgl.afd.args import AfdArgs
from minisgl.afd.coordinator import Coordinator
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest
from minisgl.models.tiny.make import make_tiny_model


def decode_step_times(path: str, num_mb: int, batch: int, steps: int) -> tuple[list[float], int]:
    args = EngineArgs(model_path=path, device="cpu", dtype="float32", context_length=512, max_running_requests=batch)
    coord = Coordinator(resolve_plan(args), AfdArgs(attn_workers=1, expert_workers=1, num_mb=num_mb, async_pending_steps=1))
    try:
        params = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
        for i in range(batch):
            coord.add_request(GenerateRequest(f"r{i}", tuple(range(1 + i % 7, 9 + i % 7)), params))
        for _ in range(4):  # prefill and warm-up
            coord.step()
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            coord.step()
            times.append(time.perf_counter() - t)
        return times, coord.plan_bytes[-1]
    finally:
        coord.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--moe-intermediate", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=4)
    ns = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        make_tiny_model(d, num_layers=ns.layers, overrides={"moe_intermediate_size": ns.moe_intermediate})
        results = {mb: decode_step_times(d, mb, ns.batch, ns.steps) for mb in (1, 2)}
    med = {mb: statistics.median(t) * 1e3 for mb, (t, _) in results.items()}
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"AFD 1+1 on the CPU, batch {ns.batch}, {ns.layers} layers, moe_intermediate {ns.moe_intermediate}; "
          f"load average {load}")
    print(f"{'num_mb':>6} {'step ms (median)':>17} {'plan bytes/step':>16}")
    for mb, (_, size) in results.items():
        print(f"{mb:>6} {med[mb]:>17.2f} {size:>16}")
    print(f"step time mb=2 / mb=1: {med[2] / med[1]:.3f}")


if __name__ == "__main__":
    main()
