"""AFD decode steps in CUDA graphs on one GPU (every worker on cuda:0, the ipc transport), the
per-layer exchange inside both roles' graphs (afd/step_graphs.py):

- tiny Qwen3.5-MoE and Qwen3-MoE in fp32, AFD 1+1 at --afd-num-mb 1 and 2 and 2+2 at 2, pending
  depths 1-3, graphs on (every worker holds one graph per bucket after the lock-step warm-up, and
  the coordinator planned graph steps) and off (the same graph-bucket steps eagerly, at their
  padded shapes): greedy tokens identical to the colocated engine's, eager, on the same GPU, over
  64 decode steps of mixed-length prompts finishing at different steps;
- the expert worker killed while the workers replay graph steps: every in-flight request ends
  with the failure within 10 s, and every page and slot is back.

One bounded command runs them all (the lead runs it on the H200):

    PYTHONPATH=$PWD/python:$PWD/tests timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEP \
        tests/gpu/test_afd_graphs.py
"""
from __future__ import annotations

import time

import pytest
import torch

from afd_kill import kill_and_expect_every_request_failed
from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs
from minisgl.afd.coordinator import Coordinator
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.scheduler.messages import GenerateRequest

pytestmark = pytest.mark.gpu

PROMPT_LENS = [1, 7, 23, 64, 97, 40]
MAX_TOKENS = [5, 65, 17, 40, 9, 65]  # finishing at different steps; the longest decode 64 steps after the prefill
# fp32: a padded bucket may take other tiles than the colocated batch, which reorders sums; in fp32
# that cannot flip a greedy choice of the tiny models.
ENGINE = dict(device="cuda", dtype="float32", page_size=16, context_length=256, chunked_prefill_size=16,
              max_running_requests=4, num_pages=96, attention_backend="triton", gdn_backend="triton",
              moe_backend="triton")
# (checkpoint, attention lanes, expert workers, num_mb, pending depth, graphs)
CASES = [
    ("bf16", 1, 1, 1, 1, True), ("bf16", 1, 1, 2, 2, True), ("bf16", 1, 1, 2, 3, False),
    ("qwen3_moe", 1, 1, 1, 3, True), ("qwen3_moe", 1, 1, 2, 1, True), ("bf16", 2, 2, 2, 2, True),
]


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(99)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def colocated(tiny_checkpoints):
    """Each model's greedy tokens from the colocated engine on this GPU, eager."""
    out = {}
    for name in ("bf16", "qwen3_moe"):
        with LLM(tiny_checkpoints[name], **ENGINE, disable_cuda_graph=True) as llm:
            prompts = _prompts(llm.engine.config.vocab_size)
            params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
            out[name] = prompts, params, [(r.token_ids, r.finish_reason) for r in llm.generate(prompts, params)]
    return out


def _afd(m: int, n: int, num_mb: int, **kwargs) -> AfdArgs:
    return AfdArgs(attn_workers=m, expert_workers=n, num_mb=num_mb, gpus=1, transport="ipc", graph_buckets=True,
                   warmup="on", step_timeout_s=60, **kwargs)


@pytest.mark.parametrize("name,m,n,num_mb,pending,graphs", CASES,
                         ids=[f"{c[0]}-{c[1]}+{c[2]}-mb{c[3]}-k{c[4]}-{'graphs' if c[5] else 'eager'}" for c in CASES])
def test_graph_steps_match_colocated(tiny_checkpoints, colocated, name, m, n, num_mb, pending, graphs) -> None:
    prompts, params, want = colocated[name]
    afd = _afd(m, n, num_mb, async_pending_steps=pending)
    started = time.monotonic()
    with LLM(tiny_checkpoints[name], afd=afd, **ENGINE, disable_cuda_graph=not graphs) as llm:
        coord = llm.scheduler
        ready = time.monotonic() - started
        buckets = coord.graph_buckets
        assert buckets == ((1, 2, 4) if num_mb == 1 else (1, 2)), buckets
        held = coord.warmup.graphs()
        assert held == {w: len(buckets) if graphs else 0 for w in coord.workers.names}, held
        started = time.monotonic()
        out = llm.generate(prompts, params)
        generate_s = time.monotonic() - started
        stats = coord.stats()
        assert coord.graph_steps >= max(MAX_TOKENS) - 1, f"only {coord.graph_steps} steps were graph steps"
    got = [(r.token_ids, r.finish_reason) for r in out]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"prompt {i} (length {PROMPT_LENS[i]}): AFD {g} != colocated {w}"
    assert stats.used_slots == 0 and stats.used_pages == 0 and stats.num_running == 0
    # One GPU time-slices the workers' spinning waits: these times measure the host path, not the exchange.
    print(f"\n{name} {m}+{n} mb{num_mb} k{pending} graphs={graphs}: ready in {ready:.1f} s, generate "
          f"{generate_s:.2f} s over {coord.graph_steps} graph steps; {coord.warmup.describe()}")


def test_killed_expert_worker_fails_in_flight_requests_during_graph_replay(tiny_checkpoints) -> None:
    plan = resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], **ENGINE))
    coord = Coordinator(plan, _afd(1, 1, 2))
    try:
        assert set(coord.warmup.graphs().values()) == {len(coord.graph_buckets)}, coord.warmup.graphs()
        params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
        for i in range(4):
            coord.add_request(GenerateRequest(f"r{i}", (1, 2, 3, 4 + i), params))
        while coord.graph_steps < 4:  # the prefill, then graph steps in flight
            coord.step()
        print("\nduring graph replay: " + kill_and_expect_every_request_failed(coord, "expert0"))
    finally:
        coord.close()
