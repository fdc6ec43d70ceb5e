"""The warm-up's mixed steps include the most prompt tokens a step may take beside the decodes; its
steps under whole-step GDN groups reach every group size band; a step of two prompts as halves is
among its prefill steps wherever the scheduler can build one."""
from __future__ import annotations

import pytest

from minisgl.engine.warmup import StepShape, mixed_shapes, prefill_shapes
from minisgl.prefill_budget import lone_prompt_tokens
from minisgl.prefill_groups import prefill_calls


def test_mixed_shapes_hold_the_largest_step_beside_decodes() -> None:
    shapes = mixed_shapes(4, 100, 4096, beside_most=250)
    assert StepShape((1,) * 4 + (100, 100, 50), (37,) * 4 + (0, 0, 0)) in shapes
    assert max(s.num_tokens for s in shapes) == 254


def test_no_extra_step_when_one_chunk_is_the_most() -> None:
    shapes = mixed_shapes(4, 100, 4096, beside_most=100)
    assert max(s.num_tokens for s in shapes) == 104
    assert all(len(s.extend) <= 5 for s in shapes)


def _pairs(lengths) -> bool:
    return any(p.offset for call in prefill_calls(lengths) for p in call)


@pytest.mark.parametrize("budget,chunk", [(8192, 8192), (16384, 16384), (4500, 4000), (16384, 8192), (8194, 4097),
                                          (16384, 1024), (16384, 4096), (2048, 2048)])
def test_a_step_of_halves_is_warmed_wherever_the_scheduler_can_build_one(budget: int, chunk: int) -> None:
    """If any step of two prompts within the budget runs as halves, a prefill warm-up step does (the
    Triton conv's row-map variant compiles before ready); if none can, no warm-up step is spent on it.
    A prompt takes up to a chunk, or up to lone_prompt_tokens where budget nobody else can take grows
    it (two 4K prompts under the defaults, where two 1K chunks share a group: the 122B's served 8K
    rows compiled the conv's row-map variant after ready before the warm-up counted them)."""
    longest = lone_prompt_tokens(chunk, budget)
    possible = any(_pairs((a, b)) for a in range(1000, longest + 1, 97)
                   for b in range(1000, min(longest, budget - a) + 1, 97))
    warmed = [s.extend for s in prefill_shapes(budget, chunk, 20000) if _pairs(s.extend)]
    assert bool(warmed) == possible, (warmed, possible)


@pytest.mark.parametrize("budget,chunk,max_len,lone", [(16384, 1024, 20000, 4096), (2048, 512, 20000, 2048),
                                                         (16384, 1024, 3000, 2999), (16384, 8192, 20000, 8192)])
def test_one_prompt_of_every_size_the_budget_may_grow_it_to_is_warmed(budget: int, chunk: int, max_len: int,
                                                                      lone: int) -> None:
    """A prompt alone may take up to prefill_budget.lone_prompt_tokens a step (within max_len): the
    warm-up runs one prompt of each power of two up to it, one token either side, and it itself."""
    alone = {s.extend[0] for s in prefill_shapes(budget, chunk, max_len) if len(s.extend) == 1 and not s.prefix[0]}
    assert lone in alone and max(alone) == lone
    assert {n for n in (1023, 1024, 1025, 2047, 2048, 2049) if n <= lone} <= alone
