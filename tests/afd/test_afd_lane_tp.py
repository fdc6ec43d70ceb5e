"""Tensor parallelism inside AFD attention lanes (--afd-attn-tp-size 2) gives the same tokens as
lanes of one rank: two lanes of two ranks each plus an expert worker, micro-batch ping-pong,
chunked prefill, queueing and requests finishing at different steps. Only each lane's TP rank 0
exchanges with the expert workers and replies with tokens."""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs

ENGINE = dict(dtype="float32", device="cpu", page_size=16, context_length=128, chunked_prefill_size=16,
              max_running_requests=2)
PROMPT_LENS = (1, 7, 23, 40, 33)
MAX_TOKENS = (32, 9, 32, 17, 32)


def _requests() -> tuple[list[list[int]], list[SamplingParams]]:
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in PROMPT_LENS]
    return prompts, [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]


def _afd(path: str, **afd: int) -> tuple[list[str], list[tuple[int, ...]]]:
    prompts, params = _requests()
    with LLM(path, afd=AfdArgs(**afd), **ENGINE) as llm:
        out = llm.generate(prompts, params)
        names = sorted(llm.scheduler.workers.names)
        stats = llm.scheduler.stats()
    assert stats.used_slots == 0 and stats.used_pages == 0
    return names, [o.token_ids for o in out]


def test_lane_tp2_matches_lane_tp1(tiny_checkpoints) -> None:
    path = tiny_checkpoints["bf16"]
    names1, want = _afd(path, attn_workers=2, expert_workers=1, num_mb=2)
    names2, got = _afd(path, attn_workers=2, expert_workers=1, num_mb=2, attn_tp_size=2)
    assert names1 == ["attn0", "attn1", "expert0"]
    assert names2 == ["attn0", "attn0.tp1", "attn1", "attn1.tp1", "expert0"]
    assert [len(t) for t in want] == list(MAX_TOKENS)
    assert got == want


@pytest.mark.load
def test_lane_tp2_without_shared_expert_matches_colocated(tiny_checkpoints) -> None:
    """Qwen3-MoE has no shared expert: the lane's other rank adds nothing, rank 0's routed output
    reaches it through the lane's all-reduce."""
    path = tiny_checkpoints["qwen3_moe"]
    prompts, params = _requests()
    want = [o.token_ids for o in LLM(path, **ENGINE).generate(prompts, params)]
    _, got = _afd(path, attn_workers=1, expert_workers=2, num_mb=1, attn_tp_size=2)
    assert got == want
