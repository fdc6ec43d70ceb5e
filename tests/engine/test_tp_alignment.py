"""Tensor and expert parallelism compute the single-rank engine's function: 32 greedy tokens
identical and every step's fp32 logits within 1e-5 relative error, at TP 2 and 4, EP 2 and 4 (over
as many ranks) and TP 4 with 2 expert groups of 2, on the tiny Qwen3.5-MoE and Qwen3-MoE, with
chunked prefill and steps that mix prefill chunks with decodes. gloo ranks on the CPU
(tests/tp_harness.py).

The Qwen3.5 checkpoint has 4 GDN key heads (the default tiny model has 2) so that TP 4 splits them;
both models have 2 KV heads, so TP 4 replicates each KV head on 2 ranks.
"""
from __future__ import annotations

import pytest
import torch

from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.models.tiny.make import make_tiny_model
from tp_harness import Case, RankHosts, generate, rel_err

PROMPT_LENS = (1, 7, 23, 40, 33)  # 5 requests over 4 slots: the fifth prefills beside decodes
ENGINE = dict(dtype="float32", device="cpu", page_size=16, context_length=128, chunked_prefill_size=16,
              max_running_requests=4)
STEPS = 32
# A step budget of two chunks: prompts alone would otherwise take their whole length in one step
# (prefill_budget.lone_prompt_tokens), and these steps are to hold chunks.
MAX_PREFILL = 32
REL_TOL = 1e-5
# (tp, ep): TP 2 and 4, EP 2 and 4 over as many ranks, and TP 4 with 2 expert groups (each expert TP 2).
LAYOUTS = [(2, 1), (4, 1), (2, 2), (4, 4), (4, 2)]


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoints, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tp")
    qwen35 = make_tiny_model(str(root / "qwen35"), seed=5,
                             overrides={"linear_num_key_heads": 4, "linear_num_value_heads": 8})
    # FP8 with heads and intermediates of 128 and 256, so a TP 2 share is whole 128-blocks.
    fp8 = make_tiny_model(str(root / "fp8"), fp8=True, seed=6, overrides={
        "head_dim": 128, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256})
    return {"qwen35": qwen35, "qwen3_moe": tiny_checkpoints["qwen3_moe"], "qwen35_fp8": fp8}


def _prompts() -> tuple[tuple[int, ...], ...]:
    g = torch.Generator().manual_seed(7)
    return tuple(tuple(torch.randint(0, 512, (n,), generator=g).tolist()) for n in PROMPT_LENS)


@pytest.fixture(scope="module")
def reference(checkpoints):
    return {name: generate(Engine(resolve_plan(EngineArgs(path, **ENGINE))), _prompts(), STEPS, MAX_PREFILL) for name, path in checkpoints.items()}


@pytest.fixture(scope="module")
def hosts():
    h = RankHosts()
    yield h
    h.close()


def test_reference_has_chunked_and_mixed_steps(reference) -> None:
    for want in reference.values():
        assert all(len(t) == STEPS for t in want.tokens)
        assert any(n == 16 for s in want.extend_lens for n in s)  # a prompt split into chunks
        assert any(1 in s and max(s) > 1 for s in want.extend_lens)  # decodes beside a prefill chunk


def _case(model: str, tp: int, ep: int) -> object:
    """4-rank layouts are the heavier ones (4 processes on a 2-core runner): marked load."""
    return pytest.param(model, tp, ep, marks=[pytest.mark.load] if tp == 4 else [])


@pytest.mark.parametrize("model,tp,ep", [_case(m, tp, ep) for m in ("qwen35", "qwen3_moe") for tp, ep in LAYOUTS]
                         + [_case("qwen35_fp8", 2, 1)])
def test_matches_single_rank(hosts, checkpoints, reference, model: str, tp: int, ep: int) -> None:
    got = hosts.run(Case(checkpoints[model], tp, ep, ENGINE, _prompts(), STEPS, MAX_PREFILL))
    want = reference[model]
    assert got.tokens == want.tokens
    assert got.extend_lens == want.extend_lens
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        assert a.shape == b.shape, f"step {step}"
        for row in range(b.shape[0]):
            assert rel_err(a[row], b[row]) < REL_TOL, f"step {step}, row {row}: {rel_err(a[row], b[row]):.2e}"
