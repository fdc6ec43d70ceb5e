"""Offline generation: strings and token ids, sampling, stop conditions, the default model."""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_checkpoints) -> LLM:
    return LLM(tiny_checkpoints["bf16"], dtype="float32", device="cpu", page_size=16, context_length=128)


def test_string_and_token_prompts_agree(llm: LLM) -> None:
    ids = llm.tokenizer.encode("hello world")
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a, b = llm.generate(["hello world", ids], greedy)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 8
    assert a.text == llm.tokenizer.decode(list(a.token_ids), skip_special_tokens=True)
    assert a.prompt_token_ids == tuple(ids)


def test_seeded_sampling_is_reproducible_and_batch_independent(llm: LLM) -> None:
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=12, ignore_eos=True, seed=7)
    alone = llm.generate(["abc"], p)[0].token_ids
    batched = llm.generate(["zzz", "abc", "q"], [p, p, p])[1].token_ids
    assert alone == batched
    other = llm.generate(["abc"], SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=8))[0]
    assert other.token_ids != alone


def test_stop_token_ids_and_max_tokens(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    full = llm.generate(["stop test"], greedy)[0]
    target = full.token_ids[4]
    first = full.token_ids.index(target)
    stopped = llm.generate(["stop test"], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop_token_ids=[target]))[0]
    assert stopped.token_ids == full.token_ids[: first + 1] and stopped.finish_reason == "stop"
    assert full.finish_reason == "length"


def test_stop_string_cuts_the_text(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    full = llm.generate(["the text"], greedy)[0]
    assert len(full.text) >= 4
    stop = full.text[2:4]
    cut = llm.generate(["the text"], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=stop))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]


def test_eos_finishes_unless_ignored(llm: LLM) -> None:
    eos = llm.engine.config.eos_token_ids[0]
    first = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0].token_ids[0]
    # Give EOS a scaled copy of the greedy token's lm_head row, so EOS out-scores it; restore afterwards.
    head = llm.engine.model.lm_head.weight
    saved = head[eos].clone()
    head[eos] = 3 * head[first]
    try:
        out = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=5))[0]
        kept = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    finally:
        head[eos] = saved
    assert out.finish_reason == "stop" and out.token_ids == (eos,)
    assert kept.finish_reason == "length" and len(kept.token_ids) == 5


def test_default_model_demo_path() -> None:
    llm = LLM(device="cpu", context_length=64)
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
