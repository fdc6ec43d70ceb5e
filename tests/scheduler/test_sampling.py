"""The full sampling set (temperature, top_k, top_p, min_p, repetition / presence / frequency
penalties, min_tokens, logit_bias) against an independent float64 reference (sampling_reference.py):

- the distribution the batched sampler draws from is within TV 1e-5 of the reference's (fp32
  against fp64), for each parameter alone and all together;
- n = 20,000 draws in one batched call land within 3x the expected sampling error of it (TV
  bound = 1.5 * sum_i sqrt(p_i (1 - p_i) / n), about 0.02 here) -- and farther than that from the
  distribution without the parameter, so the check can fail;
- in the real scheduler loop (overlap on and off), each greedy token is the argmax of the
  reference's processed logits, given the prompt and the tokens sampled so far.
"""
from __future__ import annotations

import pytest
import torch

from transformers import GenerationConfig

from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs
from minisgl.engine.sampler import FILTER_ROWS, Sampler
from minisgl.models.tiny.make import make_tiny_model
from sampling_reference import (
    CASES, EOS, LOOP_CASES, NEUTRAL, OUTPUT, PROMPT, VOCAB, check_greedy_loop, check_loop_outcomes, distribution,
    empirical, loop_prompts, sampler_with_history, sampling_tv_bound, tv,
)

N = 20_000



def _logits(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, VOCAB, generator=g) * 2.0
    x[0, list(EOS) + [12]] += 3.0  # make the stop tokens likely, so masking them moves real mass
    x[0, list(set(OUTPUT))] += 2.0  # and the output tokens, so penalties move real mass
    return x


@pytest.mark.parametrize("name", list(CASES))
def test_distribution_matches_reference(name: str) -> None:
    p = CASES[name]
    logits = _logits()
    want = distribution(logits[0].numpy(), p, PROMPT, OUTPUT, EOS)
    sampler = sampler_with_history(VOCAB, torch.device("cpu"), [p, p], PROMPT, OUTPUT, EOS)
    got = sampler.distribution(logits.expand(2, VOCAB).contiguous(), [0, 1]).numpy()
    assert tv(got[0], want) < 1e-5 and tv(got[1], want) < 1e-5
    without = distribution(logits[0].numpy(), NEUTRAL, PROMPT, OUTPUT, EOS)
    assert tv(want, without) > 0.05, "the case must move the distribution for the test to mean anything"


def test_mixed_batch_matches_reference() -> None:
    """Every case in one batch: each row gets its own parameters."""
    logits = torch.cat([_logits(i) for i in range(len(CASES))])
    sampler = sampler_with_history(VOCAB, torch.device("cpu"), list(CASES.values()), PROMPT, OUTPUT, EOS)
    got = sampler.distribution(logits, list(range(len(CASES)))).numpy()
    for i, p in enumerate(CASES.values()):
        assert tv(got[i], distribution(logits[i].numpy(), p, PROMPT, OUTPUT, EOS)) < 1e-5


def test_batches_past_the_row_group_match_reference_and_single_rows() -> None:
    """More rows than one filter group (with greedy rows between): every row keeps its own
    distribution, and a seeded row draws what it would draw alone."""
    cases = list(CASES.values()) + [SamplingParams(temperature=0, repetition_penalty=1.4)]
    params = [cases[i % len(cases)] for i in range(2 * FILTER_ROWS + 5)]
    logits = torch.cat([_logits(i) for i in range(len(params))])
    sampler = sampler_with_history(VOCAB, torch.device("cpu"), params, PROMPT, OUTPUT, EOS)
    got = sampler.distribution(logits, list(range(len(params)))).numpy()
    for i, p in enumerate(params):
        assert tv(got[i], distribution(logits[i].numpy(), p, PROMPT, OUTPUT, EOS)) < 1e-5, i
    batch = Sampler(VOCAB, torch.device("cpu"), EOS)
    for key, p in enumerate(params):
        batch.add(key, p, torch.Generator().manual_seed(100 + key))
    drawn = batch.sample(logits, list(range(len(params)))).tolist()
    alone = []
    for key, p in enumerate(params):
        one = Sampler(VOCAB, torch.device("cpu"), EOS)
        one.add(0, p, torch.Generator().manual_seed(100 + key))
        alone.append(int(one.sample(logits[key : key + 1], [0])))
    assert drawn == alone
    assert len(set(drawn)) > 3, "the rows must draw different tokens for the comparison to mean anything"


@pytest.mark.parametrize("name", list(CASES))
def test_draws_match_reference(name: str) -> None:
    p = CASES[name]
    logits = _logits(1)
    want = distribution(logits[0].numpy(), p, PROMPT, OUTPUT, EOS)
    got = empirical(logits, p, PROMPT, OUTPUT, EOS, N, seed=5)
    bound = sampling_tv_bound(want, N)
    assert tv(got, want) < bound, (tv(got, want), bound)
    assert tv(got, distribution(logits[0].numpy(), NEUTRAL, PROMPT, OUTPUT, EOS)) > bound


def test_min_tokens_lifts_after_enough_tokens() -> None:
    p = SamplingParams(temperature=0, min_tokens=3, max_tokens=8)
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS[0]] = 5.0
    sampler = Sampler(VOCAB, torch.device("cpu"), EOS)
    sampler.add(0, p, None)
    picks = [int(sampler.sample(logits, [0])) for _ in range(4)]
    assert picks[:3] != [EOS[0]] * 3 and EOS[0] not in picks[:3] and picks[3] == EOS[0]


def test_greedy_rows_see_bias_and_penalties_sampled_rows_alone_see_temperature() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0]] * 3)
    sampler = Sampler(4, torch.device("cpu"), ())
    sampler.add(0, SamplingParams(temperature=0, logit_bias={3: 2.5}), None)
    sampler.add(1, SamplingParams(temperature=0, repetition_penalty=4.0), None)
    sampler.add(2, SamplingParams(temperature=1.0, top_k=1), torch.Generator().manual_seed(0))
    sampler.see_prompt(1, [1])
    assert sampler.sample(logits, [0, 1, 2]).tolist() == [3, 2, 1]


def test_sampler_filters() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0]] * 3)
    sampler = Sampler(4, torch.device("cpu"), ())
    for key, p in enumerate([SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=1),
                             SamplingParams(temperature=1.0, top_p=0.01), SamplingParams(temperature=5.0, top_k=2)]):
        sampler.add(key, p, torch.Generator().manual_seed(key))
    assert sampler.sample(logits, [0, 1, 2]).tolist() == [1, 1, 1]
    # top_k=2 never picks outside the two best tokens.
    assert {int(sampler.sample(logits[:1], [3])) for _ in range(200)} == {1, 2}


def test_sampling_extremes_stay_finite() -> None:
    """Fuzzed API values once produced NaN probabilities and killed the engine."""
    logits = torch.randn(1, 64) * 6
    best = int(logits.argmax())
    sampler = Sampler(64, torch.device("cpu"), ())
    for key, p in enumerate([SamplingParams(temperature=1.0, top_p=1e-300),  # rounds to 0 in fp32
                             SamplingParams(temperature=1e-9),  # too cold to divide by
                             SamplingParams(temperature=1e300),
                             SamplingParams(temperature=1.0, min_p=1.0, repetition_penalty=1e30,
                                            frequency_penalty=2, logit_bias={0: -100})]):
        sampler.add(key, p, torch.Generator().manual_seed(0))
    assert sampler.sample(logits, [0]).item() == best
    assert sampler.sample(logits, [1]).item() == best
    assert 0 <= sampler.sample(logits, [2]).item() < 64
    assert sampler.sample(logits, [3]).item() == best or logits[0, 0] == logits.max()


def test_out_of_vocabulary_bias_is_refused(cpu_llm: LLM) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        cpu_llm.generate([[1, 2]], SamplingParams(logit_bias={10**6: 1.0}))


def test_params_validation() -> None:
    for bad in (dict(min_p=1.5), dict(repetition_penalty=0), dict(presence_penalty=2.5), dict(frequency_penalty=-3),
                dict(min_tokens=20, max_tokens=10), dict(min_tokens=-1), dict(logit_bias={"x": 1.0}),
                dict(logit_bias={-1: 1.0}), dict(logit_bias={1.5: 1.0})):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    # OpenAI's string keys; biases clamped to [-100, 100] as vLLM does.
    assert SamplingParams(logit_bias={"7": 500, "3": -1e9}).logit_bias == ((3, -100.0), (7, 100.0))


ENGINE = dict(device="cpu", dtype="float32", context_length=128, page_size=8)


@pytest.fixture(scope="module")
def cpu_llm() -> LLM:
    return LLM(**ENGINE)


@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_loop_matches_reference(cpu_llm: LLM, overlap: bool) -> None:
    outs = check_greedy_loop(cpu_llm.engine, overlap, loop_prompts(), list(LOOP_CASES.values()))
    check_loop_outcomes(cpu_llm.engine, outs)


def test_afd_samples_like_colocated(cpu_llm: LLM) -> None:
    """The attention workers sample with the same parameters: AFD 2+1 gives the colocated tokens."""
    params = [*LOOP_CASES.values(), SamplingParams(temperature=0.8, top_k=20, min_p=0.05, seed=3, max_tokens=12,
                                                   repetition_penalty=1.3, ignore_eos=True)]
    prompts = loop_prompts() + loop_prompts()[:1]
    want = cpu_llm.generate(prompts, params)
    with LLM(afd=AfdArgs(attn_workers=2, expert_workers=1, num_mb=2), **ENGINE) as afd:
        got = afd.generate(prompts, params)
    assert [(g.token_ids, g.finish_reason) for g in got] == [(w.token_ids, w.finish_reason) for w in want]


def test_offline_defaults_from_generation_config(tmp_path) -> None:
    path = make_tiny_model(str(tmp_path / "m"), num_layers=4)
    gen = GenerationConfig.from_pretrained(path)
    gen.update(do_sample=True, top_k=1, max_new_tokens=5)
    gen.save_pretrained(path)
    prompts = ["The quick brown fox"] * 3
    with_defaults = LLM(path, **ENGINE)
    assert dict(with_defaults.sampling_defaults.values) == {"top_k": 1, "max_tokens": 5}
    got = [r.token_ids for r in with_defaults.generate(prompts)]
    greedy = with_defaults.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=5))[0].token_ids
    assert all(len(t) <= 5 for t in got) and all(t == greedy for t in got)
    ignored = LLM(path, generation_config="ignore", **ENGINE)
    assert ignored.sampling_defaults.values == () and ignored.generate(prompts[:1])[0].token_ids != greedy
