"""Alignment with HF transformers loaded from the same checkpoint (fp32 on the CPU).

Covers Qwen3.5-MoE in BF16 and FP8 (HF on the independently dequantised weights), the trained
default model in both, and Qwen3-MoE:
prefill and decode logits within 1e-4 relative error, 32 greedy tokens identical, batched equal to
one at a time, chunked prefill equal to unchunked, and every page and slot back in the pool.
"""
from __future__ import annotations

import pytest
import torch

from hf_reference import load_hf_reference
from minisgl import LLM, SamplingParams

CKPTS = ["bf16", "fp8", "qwen3_moe", "trained", "trained_fp8"]
PROMPT_LENS = [1, 7, 23, 64, 97]  # across the GDN chunk (64) and several 16-token pages
STEPS = 32
REL_TOL = 1e-4


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module", params=CKPTS)
def setup(request, tiny_checkpoints):
    path = tiny_checkpoints[request.param]
    llm = LLM(path, dtype="float32", device="cpu", page_size=16, max_running_requests=8, context_length=256)
    hf = load_hf_reference(path, torch.float32)
    prompts = _prompts(llm.engine.config.vocab_size)
    return llm, hf, prompts, [_hf_greedy(hf, p, STEPS) for p in prompts]


@torch.no_grad()
def _hf_greedy(hf: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    """HF's own incremental decode (its cache, recurrent GDN steps), never stopping at EOS: the
    same semantics as ignore_eos. (generate's min_new_tokens would instead forbid EOS.)"""
    out = hf(torch.tensor([prompt]), use_cache=True)
    tokens: list[int] = []
    for _ in range(steps):
        tokens.append(int(out.logits[0, -1].argmax()))
        out = hf(torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
    return tokens


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)


def _assert_pool_empty(llm: LLM) -> None:
    """Every page and slot back, once the prefix cache lets go of what it keeps."""
    pool = llm.engine.pool
    pool.check_integrity()
    pool.flush_cache()
    pool.check_integrity()
    assert pool.free_pages == pool.total_pages and pool.free_slots == pool.num_slots


def test_prefill_and_decode_logits_match_hf(setup) -> None:
    """One mixed batch prefills every prompt; then each decode step feeds the reference's tokens,
    and our logits at every step are compared with HF's full forward over the same sequence."""
    llm, hf, prompts, ref_tokens = setup
    engine, pool = llm.engine, llm.engine.pool
    slots = [pool.allocate(len(p) + STEPS) for p in prompts]
    try:
        with torch.no_grad():
            hf_logits = [hf(torch.tensor([p + t])).logits[0].float() for p, t in zip(prompts, ref_tokens)]
        for s, p in zip(slots, prompts):
            pool.ensure_tokens(s, len(p))
        logits = engine.forward_batch(engine.make_batch(prompts, [0] * len(prompts), slots))
        for i, p in enumerate(prompts):
            assert _rel_err(logits[i], hf_logits[i][len(p) - 1]) < REL_TOL, f"prefill, prompt {i}"
        for step in range(STEPS - 1):
            lens = [len(p) + step for p in prompts]
            for s, n in zip(slots, lens):
                pool.ensure_tokens(s, n + 1)
            batch = engine.make_batch([[t[step]] for t in ref_tokens], lens, slots)
            assert batch.is_decode
            logits = engine.forward_batch(batch)
            for i, n in enumerate(lens):
                assert _rel_err(logits[i], hf_logits[i][n]) < REL_TOL, f"decode step {step}, prompt {i}"
    finally:
        for s in slots:
            pool.free(s)
    _assert_pool_empty(llm)


def test_mixed_step_matches_hf(setup) -> None:
    """A step as the server runs one while requests decode: two requests' decode rows lead (they
    take the decode kernels of the GDN and attention layers, in place on the pool) and two prompts
    prefill beside them; every row's logits against HF's."""
    llm, hf, prompts, ref_tokens = setup
    engine, pool = llm.engine, llm.engine.pool
    decoding, prefilling = [1, 2], [3, 4]
    slots = {i: pool.allocate(len(prompts[i]) + 1) for i in decoding + prefilling}
    try:
        with torch.no_grad():
            hf_logits = {i: hf(torch.tensor([prompts[i] + ref_tokens[i][:1]])).logits[0].float() for i in slots}
        for i in decoding:
            pool.ensure_tokens(slots[i], len(prompts[i]) + 1)
        engine.forward_batch(engine.make_batch([prompts[i] for i in decoding], [0] * 2, [slots[i] for i in decoding]))
        for i in prefilling:
            pool.ensure_tokens(slots[i], len(prompts[i]))
        batch = engine.make_batch([ref_tokens[i][:1] for i in decoding] + [prompts[i] for i in prefilling],
                                  [len(prompts[i]) for i in decoding] + [0, 0], [slots[i] for i in decoding + prefilling])
        assert batch.leading_decodes == 2 and not batch.is_decode
        logits = engine.forward_batch(batch)
        for row, i in enumerate(decoding + prefilling):
            position = len(prompts[i]) - (i in prefilling)
            assert _rel_err(logits[row], hf_logits[i][position]) < REL_TOL, f"row {row} (prompt {i})"
    finally:
        for s in slots.values():
            pool.free(s)
    _assert_pool_empty(llm)


def test_batched_greedy_matches_hf(setup) -> None:
    llm, _, prompts, ref_tokens = setup
    results = llm.generate(prompts, _greedy())
    for i, r in enumerate(results):
        assert list(r.token_ids) == ref_tokens[i], f"prompt {i}"
        assert r.finish_reason == "length"
    _assert_pool_empty(llm)


def test_one_at_a_time_equals_batched(setup) -> None:
    llm, _, prompts, ref_tokens = setup
    for i, p in enumerate(prompts):
        assert list(llm.generate([p], _greedy())[0].token_ids) == ref_tokens[i], f"prompt {i}"
    _assert_pool_empty(llm)


def test_chunked_prefill_equals_unchunked(setup) -> None:
    llm, _, prompts, ref_tokens = setup
    budget = llm.scheduler.prefill_budget
    llm.scheduler.prefill_budget = 5  # long prompts split into many chunks, mixed with decodes
    try:
        results = llm.generate(prompts, _greedy())
    finally:
        llm.scheduler.prefill_budget = budget
    for i, r in enumerate(results):
        assert list(r.token_ids) == ref_tokens[i], f"prompt {i}"
    _assert_pool_empty(llm)


def test_small_pool_queues_requests_and_still_matches(tiny_checkpoints) -> None:
    """With room for two requests at a time, the rest wait for freed slots instead of failing."""
    path = tiny_checkpoints["bf16"]
    llm = LLM(path, dtype="float32", device="cpu", page_size=16, max_running_requests=2, context_length=256)
    prompts = _prompts(llm.engine.config.vocab_size)
    alone = [llm.generate([p], _greedy())[0].token_ids for p in prompts]
    together = [r.token_ids for r in llm.generate(prompts, _greedy())]
    assert together == alone
    _assert_pool_empty(llm)
