"""Warm-up steps: before the server reports ready, run one step of every shape class the scheduler
can produce, so Triton compiles and autotunes every kernel specialisation at start rather than
under load, and so the memory planner can measure the largest step's activations.

Every warm-up request sits on the dummy state slot 0 and the dummy page-table row (all pages the
dummy page 0): the steps write only scratch space no request owns, on any pool.

Triton specialises integer arguments on being 1 or divisible by 16, and our kernels pick tiles
and autotune keys by power-of-two size buckets, so the prefill sizes come in a ladder: each power
of two, and one token either side of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from minisgl.engine.sampler import Sampler
from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.allocator import DUMMY_SLOT
from minisgl.prefill_budget import lone_prompt_tokens
from minisgl.prefill_groups import GROUP_REQUESTS, PIECE_ALIGN, prefill_calls
from minisgl.sampling_params import SamplingParams


@dataclass(frozen=True)
class StepShape:
    extend: tuple[int, ...]  # tokens each request feeds
    prefix: tuple[int, ...]  # tokens each request has cached before them

    @property
    def num_tokens(self) -> int:
        return sum(self.extend)


def size_ladder(top: int) -> list[int]:
    """Sizes 1..top: every power of two, one either side of it, and top itself."""
    sizes = {top}
    p = 1
    while p <= top:
        sizes.update(n for n in (p - 1, p, p + 1) if 1 <= n <= top)
        p *= 2
    return sorted(sizes)


def _split(total: int, chunk: int) -> tuple[int, ...]:
    """A step of `total` prompt tokens as the scheduler would build it: full chunks, then the rest."""
    return (chunk,) * (total // chunk) + ((total % chunk,) if total % chunk else ())


def _chunk(chunk: int, max_prefill_tokens: int, max_len: int) -> int:
    return max(1, min(chunk, max_prefill_tokens, max_len - 1))


def largest_prefill(max_prefill_tokens: int, chunk: int, max_len: int) -> StepShape:
    """The step with the most prompt tokens the scheduler can build: the activation peak."""
    parts = _split(max_prefill_tokens, _chunk(chunk, max_prefill_tokens, max_len))
    return StepShape(parts, (0,) * len(parts))


def most_requests(max_prefill_tokens: int, max_len: int) -> StepShape:
    """The step of the most requests in one GDN group (GROUP_REQUESTS) that fill the prompt budget."""
    each = max(1, min(max_prefill_tokens // GROUP_REQUESTS, max_len - 1))
    return StepShape((each,) * GROUP_REQUESTS, (0,) * GROUP_REQUESTS)


def prefill_shapes(max_prefill_tokens: int, chunk: int, max_len: int) -> list[StepShape]:
    """Prefill-only steps, up to the largest: one prompt of each ladder size up to the most one
    prompt may take (prefill_budget.lone_prompt_tokens); several chunks for the larger step sizes; a
    continued prompt (a later chunk); a mix of lengths. No request is longer than max_len, the
    longest the page table holds."""
    chunk = _chunk(chunk, max_prefill_tokens, max_len)
    lone = min(lone_prompt_tokens(chunk, max_prefill_tokens), max_len - 1)
    shapes = [StepShape((n,), (0,)) for n in size_ladder(lone) if n > 1]
    shapes += [largest_prefill(total, chunk, max_len) for total in size_ladder(max_prefill_tokens) if total > chunk]
    later = min(lone, max_len // 2)
    shapes.append(StepShape((later,), (max_len - later - 1,)))
    mixed = tuple(n for n in (chunk // 2 + 1, 17, 3) if n > 1)
    shapes.append(StepShape(mixed, (0,) * len(mixed)))
    # Many short prompts: full request groups of the GDN rule, whose peak grows with the requests.
    many = min(2 * GROUP_REQUESTS, max_prefill_tokens // 17)
    if many > 1:
        shapes.append(StepShape((min(17, max_len - 1),) * many, (0,) * many))
    halves = halves_shape(max_prefill_tokens, lone)
    return shapes + ([halves] if halves else [])


def halves_shape(max_prefill_tokens: int, longest: int) -> StepShape | None:
    """Two prompts of up to `longest` tokens each (the most a step gives one prompt: a chunk, or what
    budget nobody else can take grows it to, prefill_budget.lone_prompt_tokens) that run as halves
    (prefill_groups.prefill_calls) under the default group bound, when the budget holds such a step:
    the conv's row-map variant compiles here, not at the first such step served (the other warm-up
    steps need not pair: two 1K chunks share a group, two 4K prompts grown alone do not). Under
    whole-step groups no prompt runs alone, so none pairs. None if no pair fits."""
    a = min(longest, max_prefill_tokens // 2)
    # Equal lengths first (micro-batches of a split step pair whichever two they get); the cuts'
    # rounding can refuse one length.
    for b in (a, a - PIECE_ALIGN, a - 2 * PIECE_ALIGN):
        if b >= 1 and any(p.offset for call in prefill_calls((a, b)) for p in call):
            return StepShape((a, b), (0, 0))
    return None


def decode_shapes(sizes: Iterable[int], max_len: int) -> list[StepShape]:
    """Decode steps (one token per request) of each batch size, at a short cached context."""
    context = min(37, max_len - 1)
    return [StepShape((1,) * b, (context,) * b) for b in sizes]


def mixed_shapes(decode_rows: int, chunk: int, max_len: int, beside_most: int) -> list[StepShape]:
    """Decodes with a prefill chunk beside them, as every step looks while prompts arrive under load,
    and decode_rows decodes beside the most prompt tokens the scheduler puts there (beside_most,
    prefill_budget.py), in full chunks."""
    chunk = max(1, min(chunk, max_len - 1))
    context = min(37, max_len - 1)
    shapes = [StepShape((1,) * rows + (n,), (context,) * rows + (0,))
              for rows in sorted({1, decode_rows}) for n in sorted({min(chunk, 100), chunk})]
    if beside_most > chunk:
        parts = _split(beside_most, chunk)
        shapes.append(StepShape((1,) * decode_rows + parts, (context,) * decode_rows + (0,) * len(parts)))
    return shapes


def warmup_params() -> list[SamplingParams]:
    """The sampler's branches: greedy and filtered random sampling, each with the logit
    adjustments (bias, min_tokens, penalties and their token history), so the measured step holds
    every buffer sampling can take."""
    return [
        SamplingParams(temperature=0.0, max_tokens=2, min_tokens=1, repetition_penalty=1.1, logit_bias={0: 1.0}),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.5,
                       max_tokens=1),
    ]


def shape_batch(
    shape: StepShape, make_batch: Callable[[list[list[int]], list[int], list[int]], ForwardBatch], vocab_size: int
) -> ForwardBatch:
    """A batch of `shape` on the dummy slot, with seeded random tokens."""
    gen = torch.Generator().manual_seed(shape.num_tokens)
    tokens = [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in shape.extend]
    return make_batch(tokens, list(shape.prefix), [DUMMY_SLOT] * len(shape.extend))


def scratch_sample(logits: torch.Tensor, vocab_size: int, eos_token_ids: Sequence[int],
                   generator: torch.Generator) -> None:
    """Sample every row of `logits` with a sampler of its own, a key per row taking the warm-up's
    kinds in turn (each row holds its own adjustments and history, as a running request does), so
    no request's sampler state is touched and the step's sampling buffers are those of its rows."""
    kinds = warmup_params()
    params = [kinds[i % len(kinds)] for i in range(logits.shape[0])]
    sampler = Sampler(vocab_size, logits.device, eos_token_ids, len(params))
    for key, p in enumerate(params):
        sampler.add(key, p, None if p.greedy else generator)
    sampler.sample(logits, list(range(len(params))))


def run_shape(
    shape: StepShape,
    make_batch: Callable[[list[list[int]], list[int], list[int]], ForwardBatch],
    forward: Callable[[ForwardBatch], torch.Tensor],
    sample: Callable[[torch.Tensor], None],
    vocab_size: int,
) -> None:
    sample(forward(shape_batch(shape, make_batch, vocab_size)))
