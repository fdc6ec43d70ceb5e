"""The scheduler's host cost per decode step at 256 running requests, with the model forward
stubbed out (it returns precomputed logits), so only scheduling, batch building, sampling and
output bookkeeping are timed.

    python benchmarks/scheduler_step_cpu.py [--running 256] [--steps 200]

Prints CPU time (process_time) and wall time per step for greedy decoding, and for sampling with
logprobs, plus the share spent building the ForwardBatch (engine.make_batch).
"""
from __future__ import annotations

import argparse
import time

import torch

from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.forward_batch import ForwardBatch
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest
from minisgl.scheduler.scheduler import Scheduler

PROMPT_LEN = 32


def measure(running: int, steps: int, params: SamplingParams) -> tuple[float, float, float]:
    """(CPU ms per step, wall ms per step, make_batch CPU ms per step) over `steps` decode steps."""
    args = EngineArgs(device="cpu", dtype="float32", max_running_requests=running, page_size=16,
                      context_length=PROMPT_LEN + steps + 8, chunked_prefill_size=PROMPT_LEN * running)
    engine = Engine(resolve_plan(args))
    vocab = engine.config.vocab_size
    logits = torch.randn(running, vocab, generator=torch.Generator().manual_seed(0)) * 4

    def forward(batch: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        return logits[: batch.batch_size]

    engine.forward_batch = forward  # the stub: no model compute
    make_batch = engine.make_batch
    batch_cpu = [0.0]

    def timed_make_batch(*a: object) -> ForwardBatch:
        t = time.process_time()
        out = make_batch(*a)
        batch_cpu[0] += time.process_time() - t
        return out

    engine.make_batch = timed_make_batch
    sched = Scheduler(engine, overlap=False)
    for i in range(running):
        prompt = tuple(3 + (i * 31 + j * 7) % (vocab - 3) for j in range(PROMPT_LEN))
        sched.add_request(GenerateRequest(f"r{i}", prompt, params))
    sched.step()  # every prompt in one prefill step
    assert len(sched.running) == running and all(r.prefill_done for r in sched.running)
    batch_cpu[0] = 0.0
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        sched.step()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert len(sched.running) == running, "every request decoded through the timed steps"
    return cpu / steps * 1e3, wall / steps * 1e3, batch_cpu[0] / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ns = ap.parse_args()
    torch.set_num_threads(1)
    cases = {
        "greedy": SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True),
        "top-p sampling + 5 logprobs": SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10**6, ignore_eos=True,
                                                      logprobs=5),
    }
    print(f"scheduler host time per decode step, {ns.running} running requests, forward stubbed, {ns.steps} steps")
    for name, params in cases.items():
        cpu, wall, batch = measure(ns.running, ns.steps, params)
        print(f"  {name:<30} CPU {cpu:7.2f} ms/step  wall {wall:7.2f} ms/step  (make_batch {batch:5.2f} ms)")


if __name__ == "__main__":
    main()
