"""The AFD pool planning end to end on the CPU, with made-up device readings in the worker
processes (the CPU has no memory to measure): both workers of AFD 1+1 run the probe steps in lock
step over gloo, meet at the barrier, share their figures as if on one GPU, and the attention worker
allocates the pool its lane planned; the coordinator's lane takes that pool, and greedy tokens equal
the colocated engine's. (tests/gpu/test_afd_planned_pool.py runs it with real readings.)"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

import torch

from minisgl import LLM, SamplingParams
from minisgl.afd import launch, worker_group
from minisgl.afd.args import AfdArgs
from minisgl.afd.protocol import WarmupStep, WorkerSpec
from minisgl.engine.args import DEFAULT_MEM_FRACTION, EngineArgs
from minisgl.engine.plan import resolve_plan

ENGINE = dict(device="cpu", dtype="float32", page_size=16, context_length=256, chunked_prefill_size=16,
              max_running_requests=4)
ROW_BYTES = 10  # the made-up peak grows by 10 bytes a token: a decode row costs 10
BASE = 1_000_000  # and starts here: more than a page, so a reserve left out would show in the pages


def _peak(step: WarmupStep) -> int:
    return BASE + ROW_BYTES * sum(mb.num_tokens for mb in step.micro_batches)


def _fake_gpu_worker(spec: WorkerSpec, free: int) -> None:
    """worker_main with made-up readings: each step's peak from its tokens, `free` bytes free on one shared GPU."""
    from minisgl.afd import pool_probe, worker

    measure = worker.warm_up
    worker.warm_up = lambda runner, step: replace(measure(runner, step), peak_bytes=_peak(step))
    pool_probe.read_device = lambda device: (free, "host/fake-gpu0")
    worker.worker_main(spec)


def test_workers_plan_the_pool_the_coordinator_serves_from(tiny_checkpoints, monkeypatch) -> None:
    path = tiny_checkpoints["bf16"]
    plan = resolve_plan(EngineArgs(model_path=path, **ENGINE))
    layout = plan.layout()
    slot = layout.state_bytes_per_slot(torch.float32, getattr(torch, plan.pool.ssm_dtype))
    page = layout.kv_bytes_per_page(16, torch.float32)
    # Each worker's largest step: a prefill of 4 slots x a chunk of 16 = 64 tokens, BASE + 640 bytes;
    # both are reserved. Free memory for 4 slots (state and decode row) and 40.5 pages beside that.
    reserves = 2 * (BASE + ROW_BYTES * 64)
    free = reserves + math.ceil((4 * (slot + ROW_BYTES) + 40 * page + page // 2) / DEFAULT_MEM_FRACTION)
    monkeypatch.setattr(launch, "worker_main", functools.partial(_fake_gpu_worker, free=free))
    monkeypatch.setattr(worker_group, "plans_pools", lambda plan, devices: True)
    prompts = [list(range(1, 20 + 7 * i)) for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with LLM(path, afd=AfdArgs(), **ENGINE) as llm:
        coord = llm.scheduler
        assert (coord.lanes[0].alloc.max_running, coord.lanes[0].alloc.total_pages, coord.max_seq_len) == (4, 40, 256)
        line = coord.workers.memory["attn0"]
        assert "shared by attn0, expert0" in line and "KV pages lowered to 40" in line, line
        got = [r.token_ids for r in llm.generate(prompts, [params] * 3)]
        stats = coord.stats()
    assert stats.used_pages == 0 and stats.total_pages == 40
    with LLM(path, **ENGINE) as llm:
        want = [r.token_ids for r in llm.generate(prompts, [params] * 3)]
    assert got == want
