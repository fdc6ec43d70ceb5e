"""AFD gives the colocated engine's greedy tokens (and so HF's): over M:N, micro-batches and pending
depths, with prompts of different lengths, chunked prefill, queueing, and requests finishing at
different steps (by length and by a stop token) while others continue."""
from __future__ import annotations

import pytest
import torch

from hf_reference import load_hf_reference
from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs

PROMPT_LENS = [1, 7, 23, 64, 97, 40]
MAX_TOKENS = [5, 32, 17, 24, 9, 32]
# Every value of each knob appears, and every M:N meets both micro-batch counts.
CONFIGS = [(1, 1, 1, 1), (1, 1, 2, 3), (2, 1, 1, 2), (2, 1, 2, 1), (2, 2, 2, 2), (2, 2, 1, 3)]
ENGINE = dict(dtype="float32", device="cpu", page_size=16, context_length=256, chunked_prefill_size=16,
              max_running_requests=4)


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(99)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _colocated(path: str) -> tuple[list[list[int]], list[SamplingParams], list]:
    llm = LLM(path, **ENGINE)
    prompts = _prompts(llm.engine.config.vocab_size)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]
    first = llm.generate(prompts, params)
    # Request 1 stops at the token it produces 7th, mid-way, while the others continue.
    params[1] = SamplingParams(temperature=0, max_tokens=32, stop_token_ids=[first[1].token_ids[6]])
    return prompts, params, llm.generate(prompts, params)


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    return {name: _colocated(tiny_checkpoints[name]) for name in ("bf16", "fp8", "qwen3_moe")}


def _run_afd(path: str, prompts, params, m: int, n: int, mb: int, k: int):
    with LLM(path, afd=AfdArgs(attn_workers=m, expert_workers=n, num_mb=mb, async_pending_steps=k), **ENGINE) as llm:
        out = llm.generate(prompts, params)
        stats = llm.scheduler.stats()
    assert stats.used_slots == 0 and stats.used_pages == 0 and stats.num_running == 0
    return out


def _same(got, want) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.token_ids, g.finish_reason) == (w.token_ids, w.finish_reason), f"prompt {i}"


@pytest.mark.parametrize("m,n,mb,k", CONFIGS)
def test_bf16_matches_colocated(tiny_checkpoints, reference, m, n, mb, k) -> None:
    prompts, params, want = reference["bf16"]
    assert want[1].finish_reason == "stop" and len(want[1].token_ids) < 32  # the early finish is real
    _same(_run_afd(tiny_checkpoints["bf16"], prompts, params, m, n, mb, k), want)


def test_bf16_matches_hf(tiny_checkpoints, reference) -> None:
    prompts, _, _ = reference["bf16"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    got = _run_afd(tiny_checkpoints["bf16"], prompts, params, 2, 2, 2, 2)
    hf = load_hf_reference(tiny_checkpoints["bf16"], torch.float32)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ids = list(p)
            for _ in range(12):
                ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
            assert list(got[i].token_ids) == ids[len(p):], f"prompt {i}"


def test_fp8_checkpoint_matches_colocated(tiny_checkpoints, reference) -> None:
    prompts, params, want = reference["fp8"]
    _same(_run_afd(tiny_checkpoints["fp8"], prompts, params, 2, 2, 2, 2), want)


def test_qwen3_moe_matches_colocated(tiny_checkpoints, reference) -> None:
    prompts, params, want = reference["qwen3_moe"]
    _same(_run_afd(tiny_checkpoints["qwen3_moe"], prompts, params, 2, 1, 2, 1), want)
