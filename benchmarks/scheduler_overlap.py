"""The overlap loop on CUDA: the same tokens as the synchronous loop, and the step time it saves.

    python benchmarks/scheduler_overlap.py [--running 64] [--output-len 64] [--dtype bfloat16]

1. Mixed requests (stops, seeds, long prompts, queueing) run with overlap off and on; their
   tokens and finish reasons must match.
2. `--running` greedy requests decode `--output-len` tokens with overlap off and on; prints
   the wall time per decode step of each (the tiny model is host-bound on a GPU, which is
   where overlap pays most).
"""
from __future__ import annotations

import argparse
import time

import torch

from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.args import SchedulerArgs
from minisgl.scheduler.messages import GenerateRequest
from minisgl.scheduler.protocol import run_to_end
from minisgl.scheduler.scheduler import Scheduler
from minisgl.tokenizer.detokenizer import IncrementalDetokenizer
from minisgl.tokenizer.tokenizer import load_tokenizer


def _prompt(i: int, n: int) -> tuple[int, ...]:
    return tuple(3 + (i * 37 + j * 11) % 500 for j in range(n))


def _mixed(tokens: list[int], text: str) -> list[GenerateRequest]:
    greedy = dict(temperature=0, ignore_eos=True)
    return [
        GenerateRequest("long", _prompt(0, 300), SamplingParams(max_tokens=40, **greedy)),
        GenerateRequest("tok", _prompt(1, 12), SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[tokens[6]])),
        GenerateRequest("str", _prompt(1, 12), SamplingParams(max_tokens=30, stop=[text[-8:-5]], **greedy)),
        GenerateRequest("seeded", _prompt(3, 12), SamplingParams(temperature=0.9, seed=7, max_tokens=20,
                                                                 ignore_eos=True)),
        *(GenerateRequest(f"q{i}", _prompt(10 + i, 20 + i), SamplingParams(max_tokens=5 + i, **greedy))
          for i in range(40)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--running", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ns = ap.parse_args()
    engine = Engine(resolve_plan(EngineArgs(device="cuda", dtype=ns.dtype, max_running_requests=ns.running, page_size=16,
                               context_length=512)))
    tok = load_tokenizer(engine.model_path)

    def sched(overlap: bool) -> Scheduler:
        return Scheduler(engine, lambda skip: IncrementalDetokenizer(tok, skip), SchedulerArgs(), overlap=overlap)

    free = run_to_end(sched(False), [GenerateRequest("f", _prompt(1, 12), SamplingParams(temperature=0, max_tokens=20,
                                                                                   ignore_eos=True))])
    tokens = [t for o in free["f"] for t in o.new_token_ids]
    reqs = _mixed(tokens, tok.decode(tokens))
    sync, ovl = run_to_end(sched(False), reqs), run_to_end(sched(True), reqs)
    same = [rid for rid in sync if [t for o in sync[rid] for t in o.new_token_ids]
            == [t for o in ovl[rid] for t in o.new_token_ids]
            and sync[rid][-1].finish_reason == ovl[rid][-1].finish_reason]
    print(f"mixed requests: {len(same)}/{len(sync)} identical with overlap on "
          f"(differing: {sorted(set(sync) - set(same))})")

    params = SamplingParams(temperature=0, max_tokens=ns.output_len, ignore_eos=True)
    batch = [GenerateRequest(f"d{i}", _prompt(i, 32), params) for i in range(ns.running)]
    for overlap in (False, True, False, True):  # twice each: the first pass warms up kernels
        s = sched(overlap)
        for r in batch:
            s.add_request(r)
        s.step()  # the prefill
        torch.cuda.synchronize()
        steps, start = 0, time.perf_counter()
        while s.has_work:
            s.step()
            steps += 1
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / steps * 1e3
        print(f"overlap {'on ' if overlap else 'off'}: {ns.running} running, {steps} decode steps, {ms:.2f} ms/step")


if __name__ == "__main__":
    main()
