"""The prefix cache on the tiny model (fp32): a prompt that starts with a cached prefix gives what
the same prompt gives without the cache, at fp32 noise, and says how many tokens it reused."""
from __future__ import annotations

import random
from collections import deque

import pytest

from minisgl import LLM, SamplingParams
from minisgl.kvcache.allocator import CHECKPOINT_TAIL
from minisgl.scheduler.args import SchedulerArgs
from minisgl.scheduler.messages import GenerateRequest
from minisgl.scheduler.protocol import run_to_end
from minisgl.scheduler.request import Request
from minisgl.scheduler.rules import LPM_WINDOW, order_by_cached_prefix
from minisgl.scheduler.scheduler import Scheduler
from minisgl.tokenizer.chat import render_chat

PAGE = 16


@pytest.fixture(scope="module")
def pair(tiny_checkpoints) -> tuple[LLM, LLM]:
    kw = dict(dtype="float32", device="cpu", page_size=PAGE, context_length=256)
    return LLM(tiny_checkpoints["bf16"], **kw), LLM(tiny_checkpoints["bf16"], enable_prefix_caching=False, **kw)


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


def _prime(llm: LLM, prompt: list[int]) -> None:
    """An earlier prompt that began as `prompt` does and went its own way at its last token: the
    cache now takes all but that for shared, so `prompt` stops early to cache its prefix (at the
    last page boundary CHECKPOINT_TAIL tokens before its end, the most a prefix is cached at)."""
    other = prompt[:-1] + [2]  # _ids never gives 2
    llm.generate([other], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)


def _assert_same(a, b) -> None:  # noqa: ANN001 - GenerationResults
    """Same tokens, logprobs within 1e-5 relative: the prefill ran in other pieces, so its sums
    ran in another order."""
    assert a.token_ids == b.token_ids
    for x, y in zip(a.logprobs, b.logprobs):
        assert x.token_id == y.token_id and x.logprob == pytest.approx(y.logprob, rel=1e-5, abs=1e-6)
        assert [t for t, _ in x.top] == [t for t, _ in y.top]
        assert [v for _, v in x.top] == pytest.approx([v for _, v in y.top], rel=1e-5, abs=1e-6)


def test_a_prompt_like_no_other_caches_nothing(pair: tuple[LLM, LLM]) -> None:
    """The first prompt of its kind caches no prefix (nothing suggests it is shared); the next one
    that begins alike caches its state where the two part, from inside its one prefill step, and
    the one after reuses it."""
    cached, _ = pair
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    base = _ids(70, 50)
    steps = []
    forward = cached.engine.forward_batch

    def spy(batch, rows=None):  # noqa: ANN001, ANN202
        steps.append((batch.extend_lens, [(s.request, s.offset) for s in batch.snapshots]))
        return forward(batch, rows)

    cached.engine.forward_batch = spy
    try:
        first = cached.generate([base], params)[0]
        assert first.num_cached_tokens == 0 and steps[0] == ((70,), [])  # the whole prompt in one step
        steps.clear()
        second = cached.generate([base[:60] + _ids(20, 51)], params)[0]
        shared = 60 // PAGE * PAGE
        assert second.num_cached_tokens == 0 and steps[0] == ((80,), [(0, shared)])  # no stop to cache
        third = cached.generate([base[:60] + _ids(20, 51)[:-1] + [9, 9]], params)[0]
        assert third.num_cached_tokens == shared  # not near the second's end: no chat turn
    finally:
        cached.engine.forward_batch = forward


def test_a_shared_prefix_is_reused_at_fp32_noise(pair: tuple[LLM, LLM]) -> None:
    cached, plain = pair
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
    first = _ids(70, 1)
    at = (len(first) - CHECKPOINT_TAIL) // PAGE * PAGE
    _prime(cached, first)
    a, a_plain = cached.generate([first], params)[0], plain.generate([first], params)[0]
    assert a.num_cached_tokens == 0 and a_plain.num_cached_tokens == 0
    _assert_same(a, a_plain)  # the calls cut at the checkpoint change nothing beyond noise
    second = first[:60] + _ids(30, 2)
    b, b_plain = cached.generate([second], params)[0], plain.generate([second], params)[0]
    assert b.num_cached_tokens == at and b_plain.num_cached_tokens == 0
    _assert_same(b, b_plain)
    # The penalty reads the prompt tokens the cache skipped too.
    penalised = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3, repetition_penalty=1.5)
    third = first[:50] + _ids(20, 3)
    c, c_plain = cached.generate([third], penalised)[0], plain.generate([third], penalised)[0]
    assert c.num_cached_tokens == at
    _assert_same(c, c_plain)


def test_prompt_logprobs_score_the_whole_prompt(pair: tuple[LLM, LLM]) -> None:
    cached, plain = pair
    prompt = _ids(80, 4)
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    assert cached.generate([prompt], greedy)[0].num_cached_tokens == 0
    scored = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=1)
    got, want = cached.generate([prompt + [7]], scored)[0], plain.generate([prompt + [7]], scored)[0]
    assert got.num_cached_tokens == 0
    assert got.prompt_logprobs[0] is None and want.prompt_logprobs[0] is None
    assert [e.logprob for e in got.prompt_logprobs[1:]] == pytest.approx(
        [e.logprob for e in want.prompt_logprobs[1:]], rel=1e-5, abs=1e-6)


def test_a_batch_of_prompts_sharing_a_stem(pair: tuple[LLM, LLM]) -> None:
    """Requests admitted in one step reuse what earlier ones cached, and the pool's books balance
    (LLM.generate checks the scheduler's integrity after each call)."""
    cached, plain = pair
    stem = _ids(40, 5)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2)
    _prime(cached, stem)
    cached.generate([stem + _ids(10, 6)], params)
    prompts = [stem + _ids(5 + i, 7 + i) for i in range(4)]
    got, want = cached.generate(prompts, params), plain.generate(prompts, params)
    assert all(g.num_cached_tokens == (50 - CHECKPOINT_TAIL) // PAGE * PAGE for g in got)
    for g, w in zip(got, want):
        _assert_same(g, w)
    pool = cached.engine.pool
    assert pool.used_slots == 0 and pool.cached_prefixes >= 1
    assert pool.free_pages + pool.evictable_pages == pool.total_pages


def test_users_of_one_system_prompt_reuse_it(pair: tuple[LLM, LLM]) -> None:
    """A system prompt that ends inside a page, then each user's own question, longer than the
    tail: the second prompt caches where the two part, and every later one reuses that (not a
    prefix that runs into another user's question), with the outputs of the plain engine."""
    cached, plain = pair
    system = _ids(45, 20)  # 2 whole pages of 16, and 13 tokens into a third
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=2)
    users = [system + _ids(40, 21 + i) for i in range(5)]
    got = [cached.generate([u], params, use_tqdm=False)[0] for u in users]
    want = plain.generate(users, params, use_tqdm=False)
    assert [g.num_cached_tokens for g in got] == [0, 0, 32, 32, 32]
    for g, w in zip(got, want):
        _assert_same(g, w)


@pytest.mark.parametrize("via", ["chat", "rendered"])
def test_the_next_chat_turn_reuses_the_last(tiny_checkpoints, via: str) -> None:
    """Qwen3.5's template renders an earlier turn without the `<think>` its generation prompt
    opened: the next turn's prompt still starts with all but the last few tokens of the last one.
    The same through generate() on text the caller rendered with the template (it ends opening the
    assistant's turn)."""
    llm = LLM(tiny_checkpoints["trained"], dtype="float32", device="cpu", page_size=PAGE, context_length=512)
    plain = LLM(tiny_checkpoints["trained"], dtype="float32", device="cpu", page_size=PAGE, context_length=512,
                enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=12)

    def say(engine: LLM, talk: list[dict[str, str]]):  # noqa: ANN202 - a GenerationResult
        if via == "chat":
            return engine.chat(talk, params, use_tqdm=False)[0]
        return engine.generate(render_chat(engine.tokenizer, talk), params, use_tqdm=False)[0]

    system = {"role": "system", "content": "You are a terse assistant. " * 4}
    say(llm, [system, {"role": "user", "content": "Hello?"}])  # another user, same system prompt
    talk = [system, {"role": "user", "content": "Name three colours of the rainbow, please."}]
    first = say(llm, talk)
    talk += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And two more?"}]
    second, want = say(llm, talk), say(plain, talk)
    turn = len(first.prompt_token_ids)
    assert second.prompt_token_ids[: turn - 2] == first.prompt_token_ids[: turn - 2]
    assert second.num_cached_tokens == (turn - CHECKPOINT_TAIL) // PAGE * PAGE > 0
    assert second.token_ids == want.token_ids


def test_reset_prefix_cache_gives_every_page_and_slot_back(pair: tuple[LLM, LLM]) -> None:
    cached, _ = pair
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    cached.generate([_ids(60, 20), _ids(70, 21)], params)
    pool = cached.engine.pool
    assert pool.cached_prefixes >= 2
    assert cached.reset_prefix_cache()
    pool.check_integrity()
    assert pool.cached_prefixes == 0 and pool.free_pages == pool.total_pages and pool.free_slots == pool.num_slots
    prompt = _ids(60, 20) + [5]
    assert cached.generate([prompt], params)[0].num_cached_tokens == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_a_prompt_that_continues_a_finished_one_takes_it_over(pair: tuple[LLM, LLM], overlap: bool) -> None:
    """An agent's next call: the prompt holds everything the last request fed (its prompt and its
    output), then more. With the overlap loop the step after a stop token still feeds it, so the
    parked sequence ends after it; without, before it. Either way the taker's logprobs are the
    plain run's."""
    cached, plain = pair
    first = _ids(50, 30 + overlap)
    free = plain.generate([first], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].token_ids
    stop_at = SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[free[4]])
    sched = Scheduler(cached.engine, overlap=overlap)
    sched.add_request(GenerateRequest("a", tuple(first), stop_at))
    out = [t for _ in range(50) if sched.has_work for o in sched.step() for t in o.new_token_ids]
    sched.check_integrity()
    assert out[-1] == free[4] and len(out) <= 5
    fed = len(first) + len(out) - (not overlap)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
    nxt = first + out + _ids(12, 32)
    got, want = cached.generate([nxt], params)[0], plain.generate([nxt], params)[0]
    assert got.num_cached_tokens == fed
    _assert_same(got, want)
    again = cached.generate([nxt], params)[0]  # taken over: only a shared prefix is left for it
    assert again.num_cached_tokens % PAGE == 0 and again.num_cached_tokens < fed


def test_samples_of_one_prompt_wait_for_its_prefix(pair: tuple[LLM, LLM]) -> None:
    """n samples of a prompt arrive together: the first computes the prompt, the others wait the
    step or two until its prefix is cached and reuse it, with the same outputs as without."""
    cached, plain = pair
    prompt = _ids(70, 40)
    at = (len(prompt) - CHECKPOINT_TAIL) // PAGE * PAGE
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2)
    sched = Scheduler(cached.engine)
    for i in range(4):
        sched.add_request(GenerateRequest(f"s{i}", tuple(prompt), params))
    outs: dict[str, list] = {f"s{i}": [] for i in range(4)}
    for _ in range(50):
        if not sched.has_work:
            break
        for o in sched.step():
            outs[o.rid].append(o)
    sched.check_integrity()
    assert [outs[f"s{i}"][-1].num_cached_tokens for i in range(4)] == [0, at, at, at]
    want = plain.generate([prompt], params)[0]
    for i in range(4):
        assert tuple(t for o in outs[f"s{i}"] for t in o.new_token_ids) == want.token_ids
    plain_sched = Scheduler(plain.engine)  # without the cache nobody waits: all four start at once
    for i in range(4):
        plain_sched.add_request(GenerateRequest(f"p{i}", tuple(prompt), params))
    plain_sched.step()
    assert len(plain_sched.running) == 4


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_lpm_admits_a_continuation_before_others_evict_what_it_continues(pair: tuple[LLM, LLM], policy: str) -> None:
    """One running slot and one the cache keeps: a finished call, then two other prompts and the
    call that continues it. First come, first served, the other prompts' turns evict the parked call
    before its continuation is admitted; longest cached prefix first, the continuation takes it over."""
    cached, _ = pair
    sched = Scheduler(LLM(cached.engine.model_path, dtype="float32", device="cpu", page_size=PAGE, context_length=256,
                          max_running_requests=1).engine, args=SchedulerArgs(schedule_policy=policy))
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)

    first = _ids(40, 60)
    done = run_to_end(sched, [GenerateRequest("a", tuple(first), params)])["a"]
    answer = [t for o in done for t in o.new_token_ids]
    cont = first + answer + _ids(8, 61)
    outs = run_to_end(sched, [GenerateRequest("b", tuple(_ids(40, 62)), params),
                              GenerateRequest("c", tuple(_ids(40, 63)), params),
                              GenerateRequest("a2", tuple(cont), params)])
    reused = outs["a2"][-1].num_cached_tokens
    assert reused == (len(first) + len(answer) - 1 if policy == "lpm" else 0)


def test_lpm_orders_by_cached_prefix_within_its_window() -> None:
    cached = {"0": 0, "1": 32, "2": 0, "3": 64, "4": 32}
    waiting = deque(Request(rid, [1, 2], SamplingParams()) for rid in cached)
    order_by_cached_prefix(waiting, lambda r: cached[r.rid])
    assert [r.rid for r in waiting] == ["3", "1", "4", "0", "2"]  # arrival order among equals
    crowd = deque(Request(str(i), [1, 2], SamplingParams()) for i in range(LPM_WINDOW + 1))
    order_by_cached_prefix(crowd, lambda r: int(r.rid))
    assert [r.rid for r in crowd] == [str(i) for i in range(LPM_WINDOW + 1)]  # beyond the window: as they came
    with pytest.raises(ValueError, match="schedule_policy must be one of fcfs, lpm"):
        SchedulerArgs(schedule_policy="lof")
