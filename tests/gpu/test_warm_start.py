"""On the GPU the engine plans its pool from measured memory and warms up before it serves: after
that, steps of shapes the warm-up never ran compile nothing, and no step needs more activation
memory than the planner kept free."""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.engine import compile_watch
from minisgl.models.tiny.make import make_tiny_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=[False, True], ids=["bf16", "fp8"])
def llm(request, tmp_path_factory) -> LLM:
    path = make_tiny_model(str(tmp_path_factory.mktemp("tiny")), fp8=request.param, seed=5)
    return LLM(path, device="cuda", dtype="bfloat16", context_length=3000, chunked_prefill_size=700)


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 500, (n,), generator=g).tolist() for n in lengths]


def test_pool_is_planned_and_the_final_peak_fits_the_reserve(llm: LLM) -> None:
    prep = llm.engine.preparation
    assert prep is not None, "a GPU engine without --num-pages plans its pool"
    plan, pool = prep.plan, llm.engine.pool
    assert (pool.max_running, pool.num_slots, pool.total_pages, llm.engine.max_seq_len) == (
        plan.max_running_requests, plan.max_running_requests + plan.cache_slots, plan.num_pages, 3000)
    assert plan.cache_slots >= 1  # the prefix cache is on by default
    reserve = prep.budget.step_reserve + plan.row_reserve_bytes
    assert 0 < prep.final_peak_bytes <= reserve, (prep.final_peak_bytes, reserve)
    assert plan.state_bytes + plan.kv_bytes + plan.row_reserve_bytes <= prep.budget.usable


def test_unseen_shapes_compile_nothing(llm: LLM) -> None:
    before = compile_watch.compile_count()
    # Lengths and batch mixes the warm-up ladder never ran; chunks of 700 leave odd remainders, and
    # requests finishing at different steps give every decode batch size on the way down.
    greedy = SamplingParams(temperature=0, max_tokens=23, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, top_p=0.85, top_k=17, max_tokens=11, ignore_eos=True, logprobs=3)
    prompts = _prompts([77, 1111, 6, 2345, 301, 999, 13], seed=1)
    llm.generate(prompts, [greedy if i % 2 else sampled for i in range(len(prompts))])
    llm.generate(_prompts([2999 - 23], seed=2), greedy)
    scored = SamplingParams(max_tokens=0, prompt_logprobs=2)
    llm.generate(_prompts([555], seed=3), scored)
    assert compile_watch.compile_count() == before, compile_watch.summary()
