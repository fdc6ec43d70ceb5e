"""How closely a candidate run of the trained tiny model follows a reference run: the measures the
GPU alignment tests gate on (tests/gpu/test_trained_model.py, tests/afd/test_afd_fp8_dispatch.py) and
tests/models/test_trained_agreement.py checks on the CPU.

- Teacher-forced top-1: the candidate scores the reference's greedy continuations of 8 held-out
  prompts, tokens SEAM .. SEAM + 63 of each (8 x 64 = 512 positions); its argmax must be the
  reference's token at >= MIN_TOP1 of them. The first SEAM tokens are left out: right after a
  prompt of unseen text the model is least sure (2.9% of its top-1/top-2 gaps under 0.2 in the
  first 16 tokens, 0.2% in the next 16, none after), and near-ties carry no signal about bugs,
  only about rounding.
- Greedy: the candidate's own first 32 greedy tokens must equal the reference's, except that a
  prompt may part from the reference at a step where the reference's top-1/top-2 logit gap is
  within the dtype's bound (GAP_BOUND); after that its tokens follow another context and are not
  compared.

GAP_BOUND is measured, not proven: over these continuations of the trained model, the largest change
that the dtype's rounding made on the CPU to the logit difference between the reference's top two
tokens, doubled for the GPU's other summation orders and fused kernels (docs/tiny_model.md lists
the measurements; tests/models/test_trained_agreement.py keeps checking them). A flip needs the rounding
to close the gap, so above the bound none may happen.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from minisgl import LLM, SamplingParams
from minisgl.engine.engine import Engine
from minisgl.models.tiny.corpus import load_corpus

PROMPT_LENS = (5, 12, 20, 33, 47, 64, 90, 128)
SEAM = 32
STEPS = 64  # teacher-forced positions per prompt: 512 in all
GREEDY_STEPS = 32
MIN_TOP1 = 0.99
# Bounds on the change of a top-1/top-2 logit gap (the trained model's logits have std ~5), about
# twice the largest change measured on the CPU (max over these continuations: 0.31 for bf16
# rounding everywhere, 1.08 for FP8 block-128 weights with bf16 compute and FP8 activations, 0.38
# for the FP8 AFD dispatch of the experts' input, 0.62 for an FP8 K/V cache in an fp32 model, 0.023
# through decode steps for a bf16 SSM state in an fp32 model: the tiny model's states decay within a
# few dozen tokens, so this bound says nothing of long contexts).
GAP_BOUND = {"bfloat16": 0.7, "fp8": 2.2, "fp8_dispatch": 0.8, "fp8_kv": 1.3, "bf16_state": 0.06}


# The prompts, pinned as token ids: a machine whose standard library differs from the pinned corpus
# (the GPU image's Python 3.12 does) still scores the same positions. test_trained_agreement.py
# checks the file against the corpus wherever the corpus is available.
HELDOUT_PROMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heldout_prompts.json")


def heldout_prompts_from_corpus(model_path: str) -> list[list[int]]:
    """Prompts cut from the held-out corpus files: real Python the model did not train on."""
    tok = Tokenizer.from_file(os.path.join(model_path, "tokenizer.json"))
    docs = [tok.encode(t).ids for t in load_corpus().heldout]
    g = torch.Generator().manual_seed(0)
    prompts = []
    for i, n in enumerate(PROMPT_LENS):
        doc = docs[i % len(docs)]
        start = int(torch.randint(0, len(doc) - n, (1,), generator=g))
        prompts.append(doc[start : start + n])
    return prompts


def heldout_prompts(model_path: str) -> list[list[int]]:
    """The pinned held-out prompts (model_path: the tokenizer they were cut with, checked elsewhere)."""
    with open(HELDOUT_PROMPTS) as f:
        return json.load(f)


def greedy(steps: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)


def prefill_logits(engine: Engine, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """fp32 logits [len(continuation), vocab] that predict each continuation token, in one prefill."""
    seq = prompt + continuation
    slot = engine.pool.allocate(len(seq))
    try:
        engine.pool.ensure_tokens(slot, len(seq))
        rows = torch.arange(len(prompt) - 1, len(seq) - 1, device=engine.device)
        logits = engine.forward_batch(engine.make_batch([seq[:-1]], [0], [slot]), rows)
    finally:
        engine.pool.free(slot)
    return logits.float().cpu()


def decode_logits(engine: Engine, prompts: list[list[int]], continuations: list[list[int]],
                  start: int) -> list[torch.Tensor]:
    """The logits that predict continuation tokens start.. of every prompt: each prompt and its
    first `start` tokens prefilled in one batch, then one decode step per further token for all
    prompts together (CUDA-graph replays where the engine has graphs)."""
    pool = engine.pool
    heads = [p + c[:start] for p, c in zip(prompts, continuations)]
    steps = len(continuations[0]) - start
    slots = [pool.allocate(len(h) + steps) for h in heads]
    try:
        for s, h in zip(slots, heads):
            pool.ensure_tokens(s, len(h))
        out = [engine.forward_batch(engine.make_batch(heads, [0] * len(heads), slots)).float().cpu()]
        for step in range(steps - 1):
            lens = [len(h) + step for h in heads]
            for s, n in zip(slots, lens):
                pool.ensure_tokens(s, n + 1)
            batch = engine.make_batch([[c[start + step]] for c in continuations], lens, slots)
            out.append(engine.forward_batch(batch).float().cpu())
    finally:
        for s in slots:
            pool.free(s)
    return list(torch.stack(out, dim=1))


@dataclass(frozen=True)
class Reference:
    prompts: list[list[int]]
    tokens: list[list[int]]  # greedy, SEAM + STEPS per prompt
    logits: list[torch.Tensor]  # [SEAM + STEPS, vocab] per prompt: the logits each token was chosen from


def reference(llm: LLM, prompts: list[list[int]]) -> Reference:
    tokens = [list(r.token_ids) for r in llm.generate(prompts, greedy(SEAM + STEPS))]
    logits = [prefill_logits(llm.engine, p, t) for p, t in zip(prompts, tokens)]
    for i, (t, lg) in enumerate(zip(tokens, logits)):  # the reference's decode and prefill agree
        assert lg.argmax(-1).tolist() == t, f"prompt {i}: the reference's greedy tokens are not its prefill's argmax"
    return Reference(prompts, tokens, logits)


def scored(logits: list[torch.Tensor]) -> list[torch.Tensor]:
    """The teacher-forced positions (SEAM ..) of per-prompt logits over the whole continuation."""
    return [lg[SEAM:] for lg in logits]


def top1_agreement(ref: Reference, logits: list[torch.Tensor]) -> float:
    """Share of the scored positions where `logits` (from SEAM on) pick the reference's token."""
    hits = [h for lg, t in zip(logits, ref.tokens) for h in (lg.argmax(-1) == torch.tensor(t[SEAM:])).tolist()]
    return sum(hits) / len(hits)


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def gap_change(ref: Reference, logits: list[torch.Tensor]) -> torch.Tensor:
    """|change| of the logit difference between the reference's top two tokens, at every position of
    the continuations (`logits` as ref.logits: the greedy check's steps and the scored ones)."""
    out = []
    for r, c in zip(ref.logits, logits):
        idx = r.topk(2, dim=-1).indices
        rd, cd = r.gather(1, idx), c.gather(1, idx)
        out.append(((cd[:, 0] - cd[:, 1]) - (rd[:, 0] - rd[:, 1])).abs())
    return torch.cat(out)


@dataclass(frozen=True)
class GreedyCheck:
    compared: int  # steps compared, over all prompts
    parted: int  # prompts that parted from the reference at a near-tie
    failures: tuple[str, ...]  # steps that differ although the reference's gap exceeds the bound


def greedy_check(ref: Reference, got: list[list[int]], bound: float, steps: int = GREEDY_STEPS) -> GreedyCheck:
    compared, parted, failures = 0, 0, []
    for i, (want, have, logits) in enumerate(zip(ref.tokens, got, ref.logits)):
        for s in range(steps):
            compared += 1
            if have[s] == want[s]:
                continue
            gap = float(top2_gap(logits[s]))
            if gap > bound:
                failures.append(f"prompt {i}, step {s}: token {have[s]} for {want[s]}, where the reference's "
                                f"top-1/top-2 gap is {gap:.3f} > {bound}")
            else:
                parted += 1
            break
    return GreedyCheck(compared, parted, tuple(failures))
