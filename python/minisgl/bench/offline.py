"""`python -m minisgl.bench offline`: the LLM API's throughput on the random dataset."""
from __future__ import annotations

import time

from minisgl.bench.dataset import BenchRequest
from minisgl.bench.report import render
from minisgl.llm import LLM
from minisgl.sampling_params import SamplingParams


def run(llm: LLM, reqs: list[BenchRequest], ignore_eos: bool) -> dict:
    params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=ignore_eos) for r in reqs]
    start = time.perf_counter()
    results = llm.generate([list(r.prompt_ids) for r in reqs], params)
    duration = time.perf_counter() - start
    tin = sum(len(r.prompt_ids) for r in reqs)
    tout = sum(len(r.token_ids) for r in results)
    return {
        "num_requests": len(reqs),
        "duration": duration,
        "total_input_tokens": tin,
        "total_output_tokens": tout,
        "request_throughput": len(reqs) / duration,
        "input_throughput": tin / duration,
        "output_throughput": tout / duration,
        "total_throughput": (tin + tout) / duration,
    }


def format_block(s: dict) -> str:
    return render("Offline Throughput Result", [
        ("Requests:", s["num_requests"]),
        ("Duration (s):", s["duration"]),
        ("Total input tokens:", s["total_input_tokens"]),
        ("Total generated tokens:", s["total_output_tokens"]),
        ("Request throughput (req/s):", s["request_throughput"]),
        ("Input token throughput (tok/s):", s["input_throughput"]),
        ("Output token throughput (tok/s):", s["output_throughput"]),
        ("Total token throughput (tok/s):", s["total_throughput"]),
    ])
