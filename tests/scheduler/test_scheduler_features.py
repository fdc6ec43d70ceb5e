"""Scheduler features behind the server: aborts, prompt scoring (max_tokens 0), logprobs, the
overlap loop, the prefill token budget, rejection, stop strings and the integrity check."""
from __future__ import annotations

import pytest
import torch

from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.args import SchedulerArgs
from minisgl.scheduler.messages import GenerateRequest, RequestOutput
from minisgl.scheduler.scheduler import Scheduler
from minisgl.tokenizer.detokenizer import IncrementalDetokenizer
from minisgl.tokenizer.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def engine(tiny_checkpoints) -> Engine:
    args = EngineArgs(tiny_checkpoints["bf16"], dtype="float32", device="cpu", page_size=8, max_running_requests=4,
                      context_length=96)
    return Engine(resolve_plan(args))


def _sched(engine: Engine, **kw) -> Scheduler:
    tok = load_tokenizer(engine.model_path)
    return Scheduler(engine, lambda skip: IncrementalDetokenizer(tok, skip), **kw)


def _prompt(i: int, n: int = 12) -> tuple[int, ...]:
    return tuple(3 + (i * 37 + j * 11) % 500 for j in range(n))


def _run(s: Scheduler, reqs: list[GenerateRequest]) -> dict[str, list[RequestOutput]]:
    for r in reqs:
        s.add_request(r)
    outs: dict[str, list[RequestOutput]] = {r.rid: [] for r in reqs}
    for _ in range(1000):
        if not s.has_work:
            break
        for o in s.step():
            outs[o.rid].append(o)
    _assert_idle(s)
    return outs


def _assert_idle(s: Scheduler) -> None:
    assert not s.has_work
    s.check_integrity()
    st = s.stats()
    assert (st.used_pages, st.used_slots, st.num_running, st.num_waiting) == (0, 0, 0, 0)


def _tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def test_abort_running_and_waiting_frees_at_once(engine: Engine) -> None:
    s = _sched(engine)
    for i in range(6):  # 4 slots: two wait
        s.add_request(GenerateRequest(f"r{i}", _prompt(i), GREEDY))
    s.step()
    assert s.stats().used_slots == 4 and s.stats().num_waiting == 2
    s.abort("r0")
    s.abort("r5")
    s.abort("nope")  # unknown: ignored
    assert s.stats().used_slots == 3 and s.stats().num_waiting == 1
    outs = s.step()
    aborted = {o.rid: o.finish_reason for o in outs if o.finish_reason == "abort"}
    assert aborted == {"r0": "abort", "r5": "abort"}
    while s.has_work:
        s.step()
    _assert_idle(s)


def _reference_logprobs(engine: Engine, tokens: list[int]) -> torch.Tensor:
    """log_softmax of every position's logits from one unchunked forward on a fresh slot."""
    slot = engine.pool.allocate(len(tokens))
    try:
        engine.pool.ensure_tokens(slot, len(tokens))
        logits = engine.forward_batch(engine.make_batch([tokens], [0], [slot]), torch.arange(len(tokens)))
    finally:
        engine.pool.free(slot)
    return torch.log_softmax(logits, -1)


@pytest.mark.parametrize("budget", [5, 16384])
def test_prompt_logprobs_with_max_tokens_zero(engine: Engine, budget: int) -> None:
    s = _sched(engine, args=SchedulerArgs(max_prefill_tokens=budget))
    prompt = _prompt(1, 23)
    params = SamplingParams(max_tokens=0, prompt_logprobs=3)
    outs = _run(s, [GenerateRequest("a", prompt, params)])["a"]
    assert len(outs) == 1 and outs[0].finish_reason == "length" and outs[0].new_token_ids == ()
    plp = outs[0].prompt_logprobs
    assert plp is not None and len(plp) == len(prompt) and plp[0] is None
    ref = _reference_logprobs(engine, list(prompt))
    for pos in range(1, len(prompt)):
        e = plp[pos]
        assert e.token_id == prompt[pos]
        assert e.logprob == pytest.approx(ref[pos - 1, prompt[pos]].item(), abs=1e-4)
        assert e.rank == int((ref[pos - 1] > ref[pos - 1, prompt[pos]]).sum()) + 1
        assert [t for t, _ in e.top] == ref[pos - 1].topk(3).indices.tolist()


def test_output_logprobs_match_greedy(engine: Engine) -> None:
    s = _sched(engine)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2, prompt_logprobs=0)
    outs = _run(s, [GenerateRequest("a", _prompt(2), params)])["a"]
    tokens = _tokens(outs)
    entries = [e for o in outs for e in o.logprobs]
    assert [e.token_id for e in entries] == tokens
    assert all(e.rank == 1 and e.top[0][0] == e.token_id and len(e.top) == 2 for e in entries)
    ref = _reference_logprobs(engine, list(_prompt(2)) + tokens)
    n = len(_prompt(2))
    for i, e in enumerate(entries):
        assert e.logprob == pytest.approx(ref[n - 1 + i, e.token_id].item(), abs=1e-4)
    assert outs[0].prompt_logprobs is not None and all(p.top == () for p in outs[0].prompt_logprobs[1:])


def _mixed_requests(engine: Engine) -> list[GenerateRequest]:
    """Finishes of every kind, with stops picked mid-sequence so overlap has a token to overshoot."""
    free = _run(_sched(engine), [GenerateRequest("f", _prompt(1), SamplingParams(temperature=0, max_tokens=20,
                                                                                  ignore_eos=True))])
    tokens = _tokens(free["f"])
    text = load_tokenizer(engine.model_path).decode(tokens)
    return [
        GenerateRequest("long", _prompt(0, 40), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)),
        GenerateRequest("tok", _prompt(1), SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[tokens[6]])),
        GenerateRequest("str", _prompt(1), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                                          stop=[text[-8:-5]])),
        GenerateRequest("seeded", _prompt(3), SamplingParams(temperature=0.9, seed=7, max_tokens=9, ignore_eos=True)),
        GenerateRequest("one", _prompt(4), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)),
        GenerateRequest("waits", _prompt(5, 20), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)),
    ]


def test_overlap_loop_matches_synchronous(engine: Engine) -> None:
    """Overlap runs on the CPU too (synchronously); its lagging finish detection must not change
    a single token, finish reason or logprob."""
    reqs = _mixed_requests(engine)
    runs = []
    for overlap in (False, True):
        s = _sched(engine, overlap=overlap, args=SchedulerArgs(max_prefill_tokens=16))
        runs.append(_run(s, reqs))
    sync, ovl = runs
    for rid in sync:
        assert _tokens(ovl[rid]) == _tokens(sync[rid]), rid
        assert ovl[rid][-1].finish_reason == sync[rid][-1].finish_reason, rid
        assert ovl[rid][-1].matched_stop == sync[rid][-1].matched_stop, rid
    assert len(_tokens(sync["long"])) == 12 and len(_tokens(sync["one"])) == 1
    assert sync["tok"][-1].finish_reason == sync["str"][-1].finish_reason == "stop"
    assert 6 < len(_tokens(sync["str"])) < 20 and len(_tokens(sync["tok"])) <= 7


def test_overlap_abort_mid_flight(engine: Engine) -> None:
    s = _sched(engine, overlap=True)
    s.add_request(GenerateRequest("a", _prompt(0), GREEDY))
    s.add_request(GenerateRequest("b", _prompt(1), GREEDY))
    s.step()
    s.step()
    s.abort("a")
    rest = [o for _ in range(100) if s.has_work for o in s.step()]
    assert {o.rid for o in rest if o.finished} == {"a", "b"}
    assert len([t for o in rest if o.rid == "a" for t in o.new_token_ids]) == 0
    _assert_idle(s)


def test_prefill_budget_bounds_each_step(engine: Engine) -> None:
    s = _sched(engine, args=SchedulerArgs(max_prefill_tokens=10))
    seen: list[tuple[int, ...]] = []
    forward = engine.forward_batch

    def spy(batch, rows=None):
        seen.append(batch.extend_lens)
        return forward(batch, rows)

    engine.forward_batch = spy
    try:
        outs = _run(s, [GenerateRequest(f"r{i}", _prompt(i, 17), GREEDY) for i in range(3)])
    finally:
        del engine.forward_batch
    assert all(sum(n for n in lens if n > 1) <= 10 for lens in seen)
    assert any(1 in lens and max(lens) > 1 for lens in seen), "chunked prefill mixes with decode"
    assert all(len(_tokens(o)) == 10 for o in outs.values())


def test_requests_that_can_never_fit_are_rejected(engine: Engine) -> None:
    s = _sched(engine)
    with pytest.raises(ValueError, match="maximum context length is 96 tokens"):
        s.add_request(GenerateRequest("big", tuple(range(3, 99)), GREEDY))
    with pytest.raises(ValueError, match="empty"):
        s.add_request(GenerateRequest("empty", (), GREEDY))
    s.add_request(GenerateRequest("dup", _prompt(0), GREEDY))
    with pytest.raises(ValueError, match="already in use"):
        s.add_request(GenerateRequest("dup", _prompt(0), GREEDY))
    s.abort("dup")
    s.step()
    _assert_idle(s)


def test_stop_string_and_token(engine: Engine) -> None:
    s = _sched(engine)
    free = _run(s, [GenerateRequest("free", _prompt(2), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))])
    tokens = _tokens(free["free"])
    tok = load_tokenizer(engine.model_path)
    text = tok.decode(tokens)
    stop = text[5:7]
    outs = _run(s, [
        GenerateRequest("s", _prompt(2), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])),
        GenerateRequest("t", _prompt(2), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                                        stop_token_ids=[tokens[3]])),
    ])
    assert outs["s"][-1].finish_reason == "stop" and outs["s"][-1].matched_stop == stop
    assert stop in tok.decode(_tokens(outs["s"])) and stop not in tok.decode(_tokens(outs["s"])[:-1])
    assert _tokens(outs["t"]) == tokens[: tokens.index(tokens[3]) + 1]
    assert outs["t"][-1].matched_stop == tokens[3]


def test_integrity_check_catches_a_leak(engine: Engine) -> None:
    s = _sched(engine)
    slot = engine.pool.allocate(8)  # held by nobody the scheduler knows
    try:
        engine.pool.allocator._free_slots.append(slot)  # and double-counted as free
        with pytest.raises(AssertionError, match="slot pool corrupt"):
            s.check_integrity()
    finally:
        engine.pool.allocator._free_slots.pop()
        engine.pool.free(slot)
    s.check_integrity()


