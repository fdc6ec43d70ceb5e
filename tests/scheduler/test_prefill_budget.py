"""The step's prompt-token budget beside decodes (prefill_budget.py) and plan_batch applying it."""
from __future__ import annotations

from collections import deque

import pytest

from minisgl.engine.args import EngineArgs
from minisgl.prefill_budget import step_prefill_budget
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.request import Request
from minisgl.scheduler.rules import plan_batch

MAX_SEQ = 4096
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.mark.parametrize(
    "decodes, per_decode, expected",
    [
        (0, 16, 16384),  # nothing decodes: the whole step budget
        (1, 16, 1024),  # a small batch keeps one chunk
        (64, 16, 1024),  # 64 x 16 is one chunk
        (65, 16, 1040),
        (512, 16, 8192),
        (2000, 16, 16384),  # never above --max-prefill-tokens
        (512, 0, 1024),  # 0: one chunk at any batch
    ],
)
def test_budget_grows_with_the_decode_batch(decodes: int, per_decode: int, expected: int) -> None:
    assert step_prefill_budget(decodes, 1024, per_decode, 16384) == expected


def test_a_chunk_above_the_step_budget_is_capped() -> None:
    assert step_prefill_budget(3, 1024, 16, 512) == 512


class _Pool:
    """Admits every request: the budget alone decides the step."""

    def __init__(self) -> None:
        self.next_slot = 0

    def can_allocate(self, reserve_tokens: int) -> bool:
        return True

    def allocate(self, reserve_tokens: int) -> int:
        self.next_slot += 1
        return self.next_slot


def _decoding(i: int) -> Request:
    r = Request(f"d{i}", [5, 6, 7], PARAMS)
    r.output_ids.append(9)
    r.num_computed = r.seq_len - 1  # prompt fed, the newest token not yet
    return r


@pytest.mark.parametrize("decodes, prefill", [(0, 4 * 100), (4, 100), (20, 200), (40, 300)])
def test_plan_batch_takes_the_budget_beside_decodes(decodes: int, prefill: int) -> None:
    """chunk 100, 10 tokens a decode, step budget 300; four waiting prompts of 150 tokens."""
    running = [_decoding(i) for i in range(decodes)]
    waiting = deque(Request(f"w{i}", list(range(3, 153)), PARAMS) for i in range(4))
    items = plan_batch(running, waiting, _Pool(), MAX_SEQ, chunk_size=100, prefill_budget=300 if decodes else 400,
                       per_decode=10)
    assert sum(n for r, n in items if r.rid.startswith("d")) == decodes
    chunks = [n for r, n in items if r.rid.startswith("w")]
    assert sum(chunks) == prefill
    assert max(chunks) <= 100, "each request's chunk stays at most --chunked-prefill-size"


def test_negative_tokens_per_decode_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_tokens_per_decode must be >= 0"):
        EngineArgs(prefill_tokens_per_decode=-1)
