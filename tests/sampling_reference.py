"""An independent float64 reference of the next-token distribution that vLLM's sampling parameters
define, written from their documented meaning, one request at a time in numpy; and the cases and
checks that the CPU sampling tests and the GPU (CUDA-graph) ones share."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from minisgl.engine.engine import Engine
from minisgl.engine.sampler import Sampler
from minisgl.kvcache.allocator import Admission
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest
from minisgl.scheduler.scheduler import Scheduler
from minisgl.models.tiny.tokenizer import IM_END, special_token_ids


def processed_logits(
    logits: np.ndarray, p: SamplingParams, prompt: Sequence[int], output: Sequence[int], eos: Sequence[int]
) -> np.ndarray:
    """What greedy and sampled rows alike see: min_tokens, logit_bias, then the penalties."""
    x = logits.astype(np.float64).copy()
    if len(output) < p.min_tokens:
        for t in set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos)):
            x[t] = -math.inf
    for t, b in p.logit_bias:
        x[t] += b
    counts = Counter(output)
    seen = set(prompt) | set(output)
    for t in range(len(x)):
        if t in seen and math.isfinite(x[t]):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        if counts[t]:
            x[t] -= p.frequency_penalty * counts[t] + p.presence_penalty
    return x


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


def distribution(
    logits: np.ndarray, p: SamplingParams, prompt: Sequence[int] = (), output: Sequence[int] = (),
    eos: Sequence[int] = (),
) -> np.ndarray:
    """The probability of each next token."""
    x = processed_logits(logits, p, prompt, output, eos)
    if p.greedy:
        out = np.zeros_like(x)
        out[int(np.argmax(x))] = 1.0
        return out
    x = x / p.temperature
    probs = _softmax(x)
    keep = probs >= p.min_p * probs.max()
    if 0 < p.top_k < len(x):
        kth = np.sort(x)[::-1][p.top_k - 1]
        keep &= x >= kth
    if p.top_p < 1:
        masked = np.where(keep, x, -math.inf)
        q = _softmax(masked)
        order = np.argsort(-q, kind="stable")
        before = np.cumsum(q[order]) - q[order]  # mass of the better tokens
        nucleus = np.zeros_like(keep)
        nucleus[order[(before < p.top_p) | (np.arange(len(x)) == 0)]] = True
        keep &= nucleus
    return _softmax(np.where(keep, x, -math.inf))


def tv(a: np.ndarray, b: np.ndarray) -> float:
    """Total-variation distance between two distributions."""
    return 0.5 * float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).sum())


def sampling_tv_bound(p: np.ndarray, n: int) -> float:
    """Three times the expected total-variation distance of an n-draw empirical histogram from p,
    bounded by E|f_i - p_i| <= sqrt(p_i (1 - p_i) / n)."""
    return 3 * 0.5 * float(np.sqrt(p * (1 - p) / n).sum())


def sampler_with_history(
    vocab: int, device: torch.device, params: Sequence[SamplingParams], prompt: Sequence[int],
    output: Sequence[int], eos: Sequence[int], seed: int = 0,
) -> Sampler:
    """A sampler with one key per params, all of which saw `prompt` and then sampled `output`
    (forced through one-hot logits, so the device-side history and the min_tokens count come
    from sample() itself)."""
    sampler = Sampler(vocab, device, eos)
    gen = torch.Generator(device=device).manual_seed(seed)
    keys = list(range(len(params)))
    for key, p in zip(keys, params):
        sampler.add(key, p, gen)
        sampler.see_prompt(key, prompt)
    for t in output:
        force = torch.full((len(keys), vocab), -1e4, device=device)
        force[:, t] = 1e4
        assert (sampler.sample(force, keys) == t).all()
    return sampler


def empirical(
    logits: torch.Tensor, p: SamplingParams, prompt: Sequence[int], output: Sequence[int], eos: Sequence[int],
    n: int, seed: int = 0,
) -> np.ndarray:
    """Histogram of n draws of the next token: n rows with the same logits, params and history,
    sampled in one batched call on the logits' device."""
    vocab = logits.shape[-1]
    sampler = sampler_with_history(vocab, logits.device, [p] * n, prompt, output, eos, seed)
    tokens = sampler.sample(logits.expand(n, vocab).contiguous(), list(range(n))).cpu()
    return np.bincount(tokens.numpy(), minlength=vocab) / n


# -- shared cases ----------------------------------------------------------------------------------
VOCAB = 48
EOS = (5, 7)
PROMPT = (3, 9, 9, 14, 20)
OUTPUT = (9, 11, 11, 11, 30, 2)

CASES = {
    "min_p": SamplingParams(temperature=0.9, min_p=0.15),
    "repetition_penalty": SamplingParams(temperature=1.0, repetition_penalty=1.8),
    "repetition_penalty<1": SamplingParams(temperature=1.0, repetition_penalty=0.6),
    "presence_penalty": SamplingParams(temperature=1.0, presence_penalty=1.5),
    "frequency_penalty": SamplingParams(temperature=1.0, frequency_penalty=0.9),
    "negative_penalties": SamplingParams(temperature=1.0, presence_penalty=-1.0, frequency_penalty=-0.5),
    "min_tokens": SamplingParams(temperature=1.0, min_tokens=8, stop_token_ids=(12,)),
    "min_tokens_ignore_eos": SamplingParams(temperature=1.0, min_tokens=8, ignore_eos=True, stop_token_ids=(12,)),
    "logit_bias": SamplingParams(temperature=1.0, logit_bias={17: 9.0, 4: -100, 21: 1.5}),
    "everything": SamplingParams(temperature=0.7, top_k=12, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                                 presence_penalty=0.4, frequency_penalty=0.3, min_tokens=10, logit_bias={1: 2.0}),
}
NEUTRAL = SamplingParams(temperature=1.0)


IM_END_ID = special_token_ids()[IM_END]
FAVOURITES = {str(t): 60.0 for t in range(40, 52)}  # greedy picks among these; penalties move the picks
LOOP_CASES = {
    "repetition": SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.5, logit_bias=FAVOURITES,
                                 ignore_eos=True),
    "presence+frequency": SamplingParams(temperature=0, max_tokens=12, presence_penalty=-2.0, frequency_penalty=-1.0,
                                         logit_bias=FAVOURITES, ignore_eos=True),
    # EOS pushed to the top: masked for 5 tokens, then it ends the request at the 6th.
    "min_tokens": SamplingParams(temperature=0, max_tokens=12, min_tokens=5, logit_bias={str(IM_END_ID): 60.0}),
    "bias": SamplingParams(temperature=0, max_tokens=12, logit_bias={"40": 40.0, "41": 39.5}, ignore_eos=True),
}
# The same requests without the feature each case tests.
BASELINES = {
    "repetition": replace(LOOP_CASES["repetition"], repetition_penalty=1.0),
    "presence+frequency": replace(LOOP_CASES["presence+frequency"], presence_penalty=0.0, frequency_penalty=0.0),
    "min_tokens": replace(LOOP_CASES["min_tokens"], min_tokens=0),
    "bias": replace(LOOP_CASES["bias"], logit_bias=()),
}


def check_greedy_loop(
    engine: Engine, overlap: bool, prompts: list[list[int]], params: list[SamplingParams]
) -> list[list[int]]:
    """Run the requests batched through a Scheduler on the engine, recording each step's logits
    by state slot, and check every greedy token against the reference's processed logits at the
    step that produced it. Returns the tokens."""
    eos = engine.config.eos_token_ids
    sched = Scheduler(engine, overlap=overlap)
    # Per step: (slot, tokens fed up to then) of each row, and the rows' logits.
    steps: list[tuple[list[tuple[int, int]], torch.Tensor]] = []
    forward, admit = engine.forward_batch, engine.pool.admit
    slots: list[int] = []  # admission is first come, first served: request i gets the i-th slot

    def recording(batch, rows=None):  # noqa: ANN001, ANN202
        out = forward(batch, rows)
        fed = [p + e for p, e in zip(batch.prefix_lens, batch.extend_lens)]
        steps.append((list(zip(batch.slots.tolist(), fed)), out.float().cpu().clone()))
        return out

    def admitting(prompt: list[int], reserve: int, reuse: bool, chat_turn: bool = False) -> Admission:
        slots.append(admit(prompt, reserve, reuse=False).slot)
        return Admission(slots[-1])  # no reuse: each request's steps are the ones checked below

    engine.forward_batch, engine.pool.admit = recording, admitting
    try:
        for i, (ids, p) in enumerate(zip(prompts, params)):
            sched.add_request(GenerateRequest(f"r{i}", tuple(ids), p))
        outs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
        while sched.has_work:
            for o in sched.step():
                outs[o.rid].extend(o.new_token_ids)
    finally:
        engine.forward_batch, engine.pool.admit = forward, admit
    sched.check_integrity()
    for i, (ids, p) in enumerate(zip(prompts, params)):
        got, slot = outs[f"r{i}"], slots[i]
        # The t-th step that ran this slot past its prompt produced its t-th token (later ones are
        # overshoot; a step that stops inside the prompt, to cache its prefix, samples nothing).
        rows = [logits[j] for fed, logits in steps for j, (s, n) in enumerate(fed) if s == slot and n >= len(ids)]
        for t, tok in enumerate(got):
            x = processed_logits(rows[t].numpy(), p, ids, got[:t], eos)
            assert x[tok] >= x.max() - 1e-4, f"request {i} step {t}: took {tok}, reference argmax {x.argmax()}"
    return [outs[f"r{i}"] for i in range(len(prompts))]


def loop_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    return [torch.randint(10, 256, (7,), generator=g).tolist() for _ in LOOP_CASES]


def check_loop_outcomes(engine: Engine, outs: list[list[int]]) -> None:
    """Each case must change the tokens its baseline gives, so the reference check cannot pass vacuously."""
    base = check_greedy_loop(engine, False, loop_prompts(), list(BASELINES.values()))
    for name, got, plain in zip(LOOP_CASES, outs, base):
        assert got != plain, name
    by_name = dict(zip(LOOP_CASES, outs))
    assert by_name["min_tokens"][5:] == [IM_END_ID] and IM_END_ID not in by_name["min_tokens"][:5]
    assert set(by_name["bias"]) <= {40, 41} and len(by_name["bias"]) == 12


