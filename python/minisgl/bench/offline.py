"""`python -m minisgl.bench offline`: the LLM API's throughput on a benchmark dataset."""
from __future__ import annotations

import time

from minisgl.bench.dataset import BenchRequest
from minisgl.bench.report import render, throughput, throughput_rows
from minisgl.llm import LLM
from minisgl.sampling_params import SamplingParams


def run(llm: LLM, reqs: list[BenchRequest], ignore_eos: bool) -> dict:
    params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=ignore_eos) for r in reqs]
    start = time.perf_counter()
    results = llm.generate([list(r.prompt_ids) for r in reqs], params, use_tqdm=False)
    duration = time.perf_counter() - start
    tin = sum(len(r.prompt_ids) for r in reqs)
    return throughput(len(reqs), tin, sum(len(r.token_ids) for r in results), duration)


def format_block(s: dict) -> str:
    return render("Offline Throughput Result", throughput_rows(s))
