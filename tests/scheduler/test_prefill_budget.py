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
    "decodes, requests, per_request, expected",
    [
        (0, 300, 16, 16384),  # nothing decodes: the whole step budget
        (1, 1, 16, 1024),  # a few requests keep one chunk
        (32, 64, 16, 1024),  # 64 x 16 is one chunk
        (16, 200, 16, 3200),  # a burst beside a few decodes
        (512, 512, 16, 8192),
        (512, 2000, 16, 16384),  # never above --max-prefill-tokens
        (512, 512, 0, 1024),  # 0: one chunk always
    ],
)
def test_budget_grows_with_the_requests(decodes: int, requests: int, per_request: int, expected: int) -> None:
    assert step_prefill_budget(decodes, requests, 1024, per_request, 16384) == expected


def test_a_chunk_above_the_step_budget_is_capped() -> None:
    assert step_prefill_budget(3, 3, 1024, 16, 512) == 512


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


@pytest.mark.parametrize("decodes, waiting, prefill", [(0, 4, 400), (4, 4, 100), (4, 16, 200), (20, 12, 300)])
def test_plan_batch_takes_the_budget_beside_decodes(decodes: int, waiting: int, prefill: int) -> None:
    """chunk 100, 10 tokens a request, step budget 300 (400 without decodes); prompts of 150 tokens."""
    running = [_decoding(i) for i in range(decodes)]
    queue = deque(Request(f"w{i}", list(range(3, 153)), PARAMS) for i in range(waiting))
    items = plan_batch(running, queue, _Pool(), MAX_SEQ, chunk_size=100, prefill_budget=300 if decodes else 400,
                       per_request=10)
    assert sum(n for r, n in items if r.rid.startswith("d")) == decodes
    chunks = [n for r, n in items if r.rid.startswith("w")]
    assert sum(chunks) == prefill
    assert max(chunks) <= 100, "each request's chunk stays at most --chunked-prefill-size"


def test_negative_tokens_per_request_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_tokens_per_request must be >= 0"):
        EngineArgs(prefill_tokens_per_request=-1)
