"""AFD 1+1 on one GPU (--afd-gpus 1, the ipc transport) without --num-pages: the attention worker
plans its pool after the lock-step probe steps, beside the expert worker on the same GPU
(afd/pool_sizing.py); the coordinator's lane takes that pool; greedy tokens equal the colocated
engine's (eager, its pool pinned by --num-pages) on the same GPU, with the AFD decode steps eager
and in CUDA graphs (captured on the planned pool).

    PYTHONPATH=$PWD/python:$PWD/tests timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfEP \
        tests/gpu/test_afd_planned_pool.py
"""
from __future__ import annotations

import time

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs

pytestmark = pytest.mark.gpu

PROMPT_LENS = [1, 7, 23, 64, 97, 40]
MAX_TOKENS = [5, 32, 17, 24, 9, 32]
# fp32: the colocated and AFD steps may take other tiles, which cannot flip a greedy choice there.
ENGINE = dict(device="cuda", dtype="float32", page_size=16, context_length=256, chunked_prefill_size=16,
              max_running_requests=4, disable_cuda_graph=True, attention_backend="triton", gdn_backend="triton",
              moe_backend="triton")


@pytest.fixture(scope="module")
def colocated(tiny_checkpoints):
    """The colocated engine's greedy tokens on this GPU, eager, its pool pinned."""
    with LLM(tiny_checkpoints["bf16"], **ENGINE, num_pages=96) as llm:
        g = torch.Generator().manual_seed(99)
        prompts = [torch.randint(0, llm.engine.config.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENS]
        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
        return prompts, params, [(r.token_ids, r.finish_reason) for r in llm.generate(prompts, params)]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_planned_pool_serves_as_colocated(tiny_checkpoints, colocated, graphs: bool) -> None:
    prompts, params, want = colocated
    started = time.monotonic()
    afd = AfdArgs(attn_workers=1, expert_workers=1, gpus=1, transport="ipc", step_timeout_s=60, graph_buckets=graphs)
    with LLM(tiny_checkpoints["bf16"], afd=afd, **{**ENGINE, "disable_cuda_graph": not graphs}) as llm:
        coord = llm.scheduler
        ready = time.monotonic() - started
        lane = coord.lanes[0].alloc
        # The H200 holds far more than 4 slots of 256 tokens: the planner's cap, 4 x 256 / 16 pages.
        assert (lane.max_running, lane.total_pages, coord.max_seq_len) == (4, 64, 256)
        line = coord.workers.memory["attn0"]
        assert "AFD lane 0 memory" in line and "shared by attn0, expert0" in line and "64 pages" in line, line
        out = llm.generate(prompts, params)
        stats = coord.stats()
        held = coord.warmup.graphs()
    got = [(r.token_ids, r.finish_reason) for r in out]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"prompt {i} (length {PROMPT_LENS[i]}): AFD {g} != colocated {w}"
    assert stats.used_slots == 0 and stats.used_pages == 0 and stats.total_pages == 64
    assert (min(held.values()) > 0) == graphs, held  # with graphs, they were captured on the planned pool
    print(f"\nAFD ({'graphs' if graphs else 'eager'}) ready in {ready:.1f} s, served in "
          f"{time.monotonic() - started:.1f} s; {line}")
