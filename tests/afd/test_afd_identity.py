"""AFD gives the colocated engine's greedy tokens (and so HF's): over M:N, micro-batches and pending
depths, with prompts of different lengths, chunked prefill, queueing, and requests finishing at
different steps (by length and by a stop token) while others continue; and so do steps planned
in decode graph buckets (decode-only steps padded to a bucket, run eagerly on the CPU), whose plans
are checked step by step."""
from __future__ import annotations

import pickle
from collections import Counter, defaultdict

import pytest
import torch

from hf_reference import load_hf_reference
from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs
from minisgl.afd.protocol import AgPlan, EgPlan

PROMPT_LENS = [1, 7, 23, 64, 97, 40]
MAX_TOKENS = [5, 32, 17, 24, 9, 32]
# Every value of each knob appears, and every M:N meets both micro-batch counts.
CONFIGS = [(1, 1, 1, 1), (1, 1, 2, 3), (2, 1, 1, 2), (2, 1, 2, 1), (2, 2, 2, 2), (2, 2, 1, 3)]
ENGINE = dict(dtype="float32", device="cpu", page_size=16, context_length=256, chunked_prefill_size=16,
              max_running_requests=4)
# Graph-bucket planning: both models, 1+1 and 2+2, both micro-batch counts, pending 1-3, and the
# buckets each config must plan with (decode_buckets of a micro-batch's most requests: 4 / num_mb,
# or a --cuda-graph-max-bs of 2, which sends micro-batches of 3 and 4 decodes to the eager path).
GRAPH_CONFIGS = [("bf16", 1, 1, 1, 1, None, (1, 2, 4)), ("bf16", 2, 2, 2, 3, None, (1, 2)),
                 ("qwen3_moe", 2, 2, 1, 2, 2, (1, 2)), ("qwen3_moe", 1, 1, 2, 3, None, (1, 2))]


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


def _run_afd(path: str, prompts, params, m: int, n: int, mb: int, k: int, sent: list | None = None, **kwargs):
    """kwargs: graph_buckets, cuda_graph_max_bs. sent: gets every plan the workers were sent."""
    graphs = kwargs.pop("graph_buckets", False)
    afd = AfdArgs(attn_workers=m, expert_workers=n, num_mb=mb, async_pending_steps=k, graph_buckets=graphs,
                  warmup="on")  # the tokens after the lock-step warm-up are the colocated engine's
    with LLM(path, afd=afd, **ENGINE, **kwargs) as llm:
        if sent is not None:
            send = llm.scheduler.workers.send

            def record(name: str, data: bytes) -> None:
                sent.append(pickle.loads(data))
                send(name, data)

            llm.scheduler.workers.send = record
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


def _check_graph_steps(sent: list, workers: int, buckets: tuple[int, ...]) -> Counter:
    """Every plan of a step carries one bucket and one use_graph flag; no step mixes prefill and
    decode; a decode step whose micro-batches fit the largest bucket replays the smallest that holds
    them, any other step is eager at the next power of two. Returns the count of each kind of step."""
    steps = defaultdict(list)
    for plan in sent:
        if isinstance(plan, (AgPlan, EgPlan)):
            steps[plan.step].append(plan)
    kinds = Counter()
    for step, plans in sorted(steps.items()):
        assert len(plans) == workers, f"step {step}"
        assert len({(p.bucket, p.use_graph) for p in plans}) == 1, f"step {step}: {plans}"
        ags = [p for p in plans if isinstance(p, AgPlan)]
        mbs = [mb for p in ags for mb in p.micro_batches]
        chunks = {r.tokens is not None for mb in mbs for r in mb}
        assert len(chunks) == 1, f"step {step} mixes prefill and decode"
        largest = max(sum(r.extend_len for r in mb) for mb in mbs)
        bucket, use_graph = plans[0].bucket, plans[0].use_graph
        if chunks == {False} and largest <= buckets[-1]:
            assert use_graph and bucket == min(b for b in buckets if b >= largest), f"step {step}"
            kinds["graph"] += 1
            kinds["graph, padded"] += any(sum(r.extend_len for r in mb) < bucket for mb in mbs)
            kinds["graph, idle lane"] += any(not any(p.micro_batches) for p in ags)
        else:
            assert not use_graph and bucket == 1 << (largest - 1).bit_length(), f"step {step}"
            kinds["eager prefill" if chunks == {True} else "eager decode"] += 1
    return kinds


@pytest.mark.parametrize("model,m,n,mb,k,max_bs,buckets", GRAPH_CONFIGS)
def test_graph_bucket_steps_match_colocated(tiny_checkpoints, reference, model, m, n, mb, k, max_bs, buckets) -> None:
    prompts, params, want = reference[model]
    sent: list = []
    got = _run_afd(tiny_checkpoints[model], prompts, params, m, n, mb, k, sent, graph_buckets=True,
                   cuda_graph_max_bs=max_bs)
    _same(got, want)
    kinds = _check_graph_steps(sent, m + n, buckets)
    assert kinds["graph, padded"] and kinds["eager prefill"], kinds
    assert bool(kinds["eager decode"]) == (max_bs is not None), kinds
    assert bool(kinds["graph, idle lane"]) == (m > 1), kinds


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
