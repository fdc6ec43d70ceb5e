"""The step's prompt-token budget beside decodes (prefill_budget.py) and plan_batch applying it."""
from __future__ import annotations

from collections import deque

import pytest

from minisgl.engine.args import EngineArgs
from minisgl.kvcache.allocator import Admission
from minisgl.prefill_budget import lone_prompt_tokens, step_prefill_budget
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.request import Request
from minisgl.scheduler.rules import PROMPT_LOGPROB_TOKENS, plan_batch

MAX_SEQ = 4096
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.mark.parametrize(
    "decodes, prefilling, requests, per_request, expected",
    [
        (0, 300, 300, 16, 16384),  # nothing decodes: the whole step budget
        (1, 0, 1, 16, 1024),  # a few requests keep one chunk
        (32, 2, 64, 16, 1024),  # 64 x 16 is one chunk; 2 prompts beside 32 decodes: a chunk
        (100, 199, 300, 16, 4806),  # 49 prompts beyond 1.5x the decodes: a chunk + 98/398 of the rest
        (100, 99, 300, 16, 4800),  # fewer prompts than decodes: 300 requests x 16
        (16, 184, 200, 16, 14380),  # 184 prompts beside 16 decodes: a chunk + 320/368 of the rest
        (24, 76, 100, 16, 9108),  # vLLM's Long Context midway: 76 prompts of 32K beside 24 decodes
        (4, 57, 61, 16, 14767),  # 57 long prompts beside 4 decodes
        (20, 31, 51, 0, 1519),  # one prompt beyond 1.5x the decodes: a chunk + 2/62 of the rest
        (30, 31, 61, 0, 1024),  # more prompts than decodes, fewer than 1.5x: one chunk
        (512, 512, 1024, 16, 16384),  # never above --max-prefill-tokens
        (512, 512, 512, 0, 1024),  # a prompt per decode and no per-request share: one chunk
    ],
)
def test_budget_weighs_prompts_against_decodes(
    decodes: int, prefilling: int, requests: int, per_request: int, expected: int
) -> None:
    assert step_prefill_budget(decodes, prefilling, requests, 1024, per_request, 16384) == expected


def test_a_chunk_above_the_step_budget_is_capped() -> None:
    assert step_prefill_budget(3, 3, 3, 1024, 16, 512) == 512


class _Pool:
    """Admits every request: the budget alone decides the step."""

    def __init__(self) -> None:
        self.next_slot = 0

    def can_allocate(self, reserve_tokens: int) -> bool:
        return True

    def admit(self, prompt: list[int], reserve_tokens: int, reuse: bool, chat_turn: bool = False) -> Admission:
        self.next_slot += 1
        return Admission(self.next_slot)

    def awaits_prefix(self, prompt: list[int]) -> bool:
        return False


def _decoding(i: int) -> Request:
    r = Request(f"d{i}", [5, 6, 7], PARAMS)
    r.output_ids.append(9)
    r.num_computed = r.seq_len - 1  # prompt fed, the newest token not yet
    return r


@pytest.mark.parametrize(
    "decodes, waiting, prefill",
    [(0, 4, 400), (4, 2, 100), (20, 12, 160), (20, 40, 300), (2, 6, 200), (4, 16, 225)],
)
def test_plan_batch_takes_the_budget_beside_decodes(decodes: int, waiting: int, prefill: int) -> None:
    """chunk 100, 5 tokens a request, step budget 300 (400 without decodes); prompts of 150 tokens.
    (4, 2): one chunk; (20, 12): 32 requests x 5 = 160, a chunk and 60 tokens of the next prompt;
    (20, 40): 60 x 5 = 300; (2, 6): 6 prompts beside 2 decodes, 3 beyond 1.5x them, a chunk and 3/6
    of the other 200; (4, 16): a chunk and 10/16 of 200."""
    running = [_decoding(i) for i in range(decodes)]
    queue = deque(Request(f"w{i}", list(range(3, 153)), PARAMS) for i in range(waiting))
    items = plan_batch(running, queue, _Pool(), MAX_SEQ, chunk_size=100, prefill_budget=300 if decodes else 400,
                       per_request=5)
    assert sum(n for r, n in items if r.rid.startswith("d")) == decodes
    chunks = [n for r, n in items if r.rid.startswith("w")]
    assert sum(chunks) == prefill
    assert max(chunks) <= 100, "each request's chunk stays at most --chunked-prefill-size"


def test_negative_tokens_per_request_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_tokens_per_request must be >= 0"):
        EngineArgs(prefill_tokens_per_request=-1)


def test_running_prompts_count_as_prefilling() -> None:
    """2 decodes, 4 running prompts 50 tokens in, 2 waiting: chunk 100 and 3/6 of the other 400 is
    3 chunks, all taken by the running prompts before anything is admitted."""
    running = [_decoding(i) for i in range(2)]
    for i in range(4):
        r = Request(f"p{i}", list(range(3, 153)), PARAMS)
        r.slot, r.num_computed = 10 + i, 50
        running.append(r)
    queue = deque(Request(f"w{i}", list(range(3, 153)), PARAMS) for i in range(2))
    items = plan_batch(running, queue, _Pool(), MAX_SEQ, chunk_size=100, prefill_budget=500, per_request=5)
    assert [(r.rid, n) for r, n in items if n > 1] == [("p0", 100), ("p1", 100), ("p2", 100)]
    assert len(queue) == 2


def test_prompt_logprobs_keep_their_own_bound_beside_decodes() -> None:
    scored = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=0)
    queue = deque([Request("w", list(range(3, 403)), scored)])
    items = plan_batch([_decoding(0)], queue, _Pool(), MAX_SEQ, chunk_size=1000, prefill_budget=2000, per_request=5)
    assert [(r.rid, n) for r, n in items] == [("d0", 1), ("w", PROMPT_LOGPROB_TOKENS)]


def _prefilling(rid: str, prompt_len: int, computed: int) -> Request:
    r = Request(rid, list(range(3, 3 + prompt_len)), PARAMS)
    r.slot, r.num_computed = 1, computed
    return r


@pytest.mark.parametrize(
    "chunk, max_prefill, expected",
    [(1024, 16384, 4096), (8192, 16384, 8192), (1024, 2048, 2048), (512, 300, 512)],
)
def test_lone_prompt_tokens_are_a_default_gdn_group(chunk: int, max_prefill: int, expected: int) -> None:
    """A default GDN group's tokens (4096), within the step budget, never less than a chunk."""
    assert lone_prompt_tokens(chunk, max_prefill) == expected


def test_a_lone_prompt_takes_the_budget_nobody_else_can() -> None:
    """Nothing decodes, nothing waits: a 10,000-token prompt's chunk grows to 4,096, not the step's 16K."""
    queue = deque([Request("w", list(range(10_000)), PARAMS)])
    items = plan_batch([], queue, _Pool(), 16_384, chunk_size=1024, prefill_budget=16_384, per_request=16)
    assert [(r.rid, n) for r, n in items] == [("w", 4096)]


def test_the_leftover_goes_to_the_oldest_prompts_first() -> None:
    """Two running prompts, 3,000 and 9,000 tokens left, budget 6,000: 1,024 each, then the first to
    its end (3,000) and the second the rest (3,000 in all)."""
    running = [_prefilling("p0", 3500, 500), _prefilling("p1", 10_000, 1000)]
    items = plan_batch(running, deque(), _Pool(), 16_384, chunk_size=1024, prefill_budget=6000, per_request=16)
    assert [(r.rid, n) for r, n in items] == [("p0", 3000), ("p1", 3000)]


def test_beside_decodes_a_lone_prompt_keeps_one_chunk() -> None:
    """A few decodes and one prompt: the budget is one chunk, so nothing is left to grow it (the
    inter-token latency bound is unchanged)."""
    running = [_decoding(i) for i in range(4)] + [_prefilling("p", 10_000, 0)]
    items = plan_batch(running, deque(), _Pool(), 16_384, chunk_size=1024, prefill_budget=16_384, per_request=16)
    assert [(r.rid, n) for r, n in items if n > 1] == [("p", 1024)]


def test_admissible_prompts_take_the_budget_before_any_grows() -> None:
    """20 waiting prompts of 2,000 tokens and a 16K budget: sixteen chunks of 1,024, none grown."""
    queue = deque(Request(f"w{i}", list(range(2000)), PARAMS) for i in range(20))
    items = plan_batch([], queue, _Pool(), 16_384, chunk_size=1024, prefill_budget=16_384, per_request=16)
    assert [n for _, n in items] == [1024] * 16


def test_prompts_scoring_logprobs_are_not_grown() -> None:
    scored = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=0)
    queue = deque([Request("w", list(range(3000)), scored)])
    items = plan_batch([], queue, _Pool(), 16_384, chunk_size=1024, prefill_budget=16_384, per_request=16)
    assert [(r.rid, n) for r, n in items] == [("w", PROMPT_LOGPROB_TOKENS)]


def test_beside_decodes_chunks_do_not_grow_into_a_ramped_budget() -> None:
    """2 decodes and 10 prompts running, none waiting: the budget ramps to 11,776 (prompts outnumber
    1.5x the decodes), the ten chunks take 10,240 and the rest stays unused: decodes wait behind no
    more prompt tokens than ten chunks."""
    running = [_decoding(i) for i in range(2)] + [_prefilling(f"p{i}", 10_000, 0) for i in range(10)]
    items = plan_batch(running, deque(), _Pool(), 16_384, chunk_size=1024, prefill_budget=16_384, per_request=0)
    assert step_prefill_budget(2, 10, 12, 1024, 0, 16_384) == 11_776
    assert [n for r, n in items if n > 1] == [1024] * 10
