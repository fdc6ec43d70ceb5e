"""The full sampling set on the GPU: logits from CUDA-graph decode replays, sampled on the device
by the same batched sampler, against the float64 reference (sampling_reference.py).

- the distribution drawn from is within TV 1e-5 of the reference's; 20,000 draws in one batched
  call within 1.5 * sum_i sqrt(p_i (1 - p_i) / n) of it; a batch mixing every parameter samples
  without a host sync (CUDA's sync debug mode raises on one);
- the scheduler's overlapped loop (device-side token history, decode from graphs) picks each
  greedy token as the argmax of the reference's processed logits.
"""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM
from minisgl.engine.engine import Engine
from minisgl.models.tiny.make import make_tiny_model
from sampling_reference import (
    CASES, LOOP_CASES, NEUTRAL, check_greedy_loop, check_loop_outcomes, distribution, empirical, loop_prompts,
    sampler_with_history, sampling_tv_bound, tv,
)

pytestmark = pytest.mark.gpu
N = 20_000


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = make_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=4)
    llm = LLM(path, device="cuda", dtype="float32", page_size=16, context_length=256, cuda_graph_max_bs=8)
    assert llm.engine.graph_runner is not None
    return llm.engine


def _count_replays(engine: Engine) -> list[int]:
    calls = [0]
    replay = engine.graph_runner.replay

    def counting(batch):  # noqa: ANN001, ANN202
        calls[0] += 1
        return replay(batch)

    engine.graph_runner.replay = counting
    return calls


@pytest.mark.parametrize("overlap", [True, False])
def test_graph_decode_loop_matches_reference(engine: Engine, overlap: bool) -> None:
    calls = _count_replays(engine)
    try:
        outs = check_greedy_loop(engine, overlap, loop_prompts(), list(LOOP_CASES.values()))
    finally:
        del engine.graph_runner.replay
    assert calls[0] >= 10, "decode steps must replay the captured graphs"
    check_loop_outcomes(engine, outs)


def _graph_logits(engine: Engine) -> torch.Tensor:
    """One row of logits from a graph-replayed decode step (the tiny model's real distribution)."""
    captured: list[torch.Tensor] = []
    replay = engine.graph_runner.replay

    def keeping(batch):  # noqa: ANN001, ANN202
        out = replay(batch)
        captured.append(out[:1].clone())
        return out

    engine.graph_runner.replay = keeping
    try:
        check_greedy_loop(engine, True, loop_prompts()[:1], [LOOP_CASES["bias"]])
    finally:
        del engine.graph_runner.replay
    return captured[3]


@pytest.mark.parametrize("name", list(CASES))
def test_device_distribution_and_draws(engine: Engine, name: str) -> None:
    p = CASES[name]
    logits = _graph_logits(engine)
    vocab = logits.shape[-1]
    eos = engine.config.eos_token_ids
    prompt, output = (3, 9, 9, 14, 20), (9, 11, 11, 11, 30, 40)  # no EOS among them: min_tokens masks it
    want = distribution(logits[0].cpu().double().numpy(), p, prompt, output, eos)
    sampler = sampler_with_history(vocab, logits.device, [p, p], prompt, output, eos)
    got = sampler.distribution(logits.expand(2, vocab).contiguous(), [0, 1]).cpu().numpy()
    assert tv(got[0], want) < 1e-5 and tv(got[1], want) < 1e-5
    drawn = empirical(logits, p, prompt, output, eos, N, seed=5)
    assert tv(drawn, want) <= sampling_tv_bound(want, N)  # 0 when the distribution is one token
    assert tv(want, distribution(logits[0].cpu().double().numpy(), NEUTRAL, prompt, output, eos)) > 0


def test_a_mixed_batch_samples_without_a_host_sync(engine: Engine) -> None:
    """Every case in one batch, sampled with CUDA's sync debug mode set to raise: the step queues
    its work and returns without waiting for the device."""
    logits = _graph_logits(engine)
    vocab = logits.shape[-1]
    params = list(CASES.values())
    sampler = sampler_with_history(vocab, logits.device, params, (3, 9), (9, 11, 40), engine.config.eos_token_ids)
    batch = logits.expand(len(params), vocab).contiguous()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = sampler.sample(batch, list(range(len(params))))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert tokens.shape == (len(params),) and bool(((tokens >= 0) & (tokens < vocab)).all())
