"""The official openai client against a live server on loopback: completions, chat, streaming, n,
stop, usage, logprobs, echo, and max_tokens 0 with prompt logprobs."""
from __future__ import annotations

import math

import httpx
import openai
import pytest

from minisgl.models.tiny.default import default_model_path
from minisgl.tokenizer.chat import render_chat
from minisgl.tokenizer.tokenizer import load_tokenizer
from server_harness import Server

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def client(live_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", timeout=60, max_retries=0)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def test_completion_usage_and_determinism(client: openai.OpenAI, model: str) -> None:
    a = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    b = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert a.object == "text_completion" and a.model == model
    assert a.choices[0].text == b.choices[0].text and a.choices[0].text
    assert a.choices[0].finish_reason == "length"
    assert a.usage.prompt_tokens > 0
    assert a.usage.completion_tokens == 8
    assert a.usage.total_tokens == a.usage.prompt_tokens + 8


def test_streaming_completion_matches_non_streaming(client: openai.OpenAI, model: str) -> None:
    kw = dict(model=model, prompt=PROMPT, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_n_choices_and_seed(client: openai.OpenAI, model: str) -> None:
    kw = dict(model=model, prompt=PROMPT, max_tokens=12, temperature=1.0, n=3, seed=123,
              extra_body={"ignore_eos": True})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices], "seeded sampling is reproducible"
    assert len({c.text for c in a.choices}) > 1, "each choice samples its own stream"
    assert a.usage.completion_tokens == 36
    streamed = client.completions.create(stream=True, **kw)
    texts = {0: "", 1: "", 2: ""}
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert [texts[i] for i in range(3)] == [c.text for c in a.choices]


def test_batch_of_prompts_and_token_ids(client: openai.OpenAI, model: str) -> None:
    ids = [72, 101, 108, 108, 111]
    r = client.completions.create(model=model, prompt=[PROMPT, "Hello"], max_tokens=4, temperature=0, n=2,
                                  extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert by_ids.usage.prompt_tokens == len(ids)


def test_stop_string(client: openai.OpenAI, model: str) -> None:
    free = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = free[6:8]
    assert stop and free.index(stop) >= 1
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == free[: free.index(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True,
        extra_body={"ignore_eos": True}))
    assert streamed == r.choices[0].text


def test_completion_logprobs(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    shown = "".join(t for t in lp.tokens if not t.startswith("<|"))  # special tokens are not in the text
    assert shown == r.choices[0].text or any(t.startswith("bytes:") for t in lp.tokens)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and len(top) <= 3 and max(top.values()) == pytest.approx(chosen)  # greedy = argmax


def test_max_tokens_zero_scores_the_prompt(client: openai.OpenAI, model: str, live_server: Server) -> None:
    """What alignment tools send: echo + logprobs + max_tokens 0, and vLLM's prompt_logprobs."""
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1,
                                  extra_body={"prompt_logprobs": 2})
    c = r.choices[0]
    assert c.text == PROMPT and c.finish_reason == "length" and r.usage.completion_tokens == 0
    n = r.usage.prompt_tokens
    assert len(c.logprobs.tokens) == n and c.logprobs.token_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in c.logprobs.token_logprobs[1:])
    plp = c.model_extra["prompt_logprobs"]
    assert len(plp) == n and plp[0] is None
    for pos in range(1, n):
        entry = plp[pos]
        assert 1 <= len(entry) <= 3 and all(math.isfinite(v["logprob"]) for v in entry.values())
        assert any(v["logprob"] == pytest.approx(c.logprobs.token_logprobs[pos]) for v in entry.values())
    # What minisgl.tools.align sends: token ids in, and vLLM's return_token_ids to check them.
    ids = list(range(40, 60))
    scored = client.completions.create(model=model, prompt=ids, max_tokens=0, echo=True,
                                       extra_body={"prompt_logprobs": 1, "return_token_ids": True}).choices[0]
    assert scored.model_extra["prompt_token_ids"] == ids and scored.model_extra["token_ids"] == []
    decoded = httpx.post(live_server.url + "/detokenize", json={"tokens": ids, "skip_special_tokens": False}, timeout=60)
    assert scored.text and scored.text == decoded.json()["text"]  # ids are echoed as their text
    assert all(str(ids[p]) in scored.model_extra["prompt_logprobs"][p] for p in range(1, len(ids)))
    # A prompt can be scored with echo alone, and without any logprobs it is just echoed back.
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True)
    assert plain.choices[0].text == PROMPT and plain.usage.completion_tokens == 0


def test_chat_completion(client: openai.OpenAI, model: str) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is two plus two?"}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert r.object == "chat.completion" and c.message.role == "assistant" and c.finish_reason == "length"
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 10
    assert len(c.logprobs.content) == 8 and all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
    assert bytes(b for t in c.logprobs.content for b in t.bytes).decode(errors="replace") == c.message.content \
        or "\ufffd" in c.message.content
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == c.message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_n_and_max_completion_tokens(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], n=2,
                                       max_completion_tokens=3, temperature=0.8, seed=1,
                                       extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 6


def test_stop_token_ids_finish_with_stop(client: openai.OpenAI, model: str) -> None:
    """Sampling hot for 200 tokens meets one of ten stop ids (the specials among them) somewhere."""
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, temperature=1.0, n=8, seed=5,
                                  extra_body={"stop_token_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]})
    assert "stop" in {c.finish_reason for c in r.choices}


def test_metrics_and_health(live_server: Server) -> None:
    assert live_server.get("/health").status_code == 200
    text = live_server.get("/metrics").text
    for name in ("minisgl:num_running_reqs", "minisgl:token_usage", "minisgl:prompt_tokens_total",
                 "minisgl:generation_tokens_total", "minisgl:time_to_first_token_seconds_bucket",
                 "minisgl:inter_token_latency_seconds_bucket", "minisgl:num_queue_reqs"):
        assert name in text, name


def _cached_total(server: Server) -> float:
    lines = server.get("/metrics").text.splitlines()
    line = next(line for line in lines if line.startswith("minisgl:cached_prompt_tokens_total"))
    return float(line.rsplit(" ", 1)[1])


def test_usage_counts_the_prompt_tokens_the_cache_served(live_server: Server, client: openai.OpenAI,
                                                          model: str) -> None:
    """The first prompt of its kind is not cached; the next one that begins alike and goes on
    differently stops where they part to cache what they share (whole pages of 16); the one after
    reuses it: usage.prompt_tokens_details.cached_tokens says how many, and so does the metric."""
    before = _cached_total(live_server)
    stem = list(range(100, 140))  # 40 token ids: 2 whole pages, 8 tokens into a third
    first = client.completions.create(model=model, prompt=stem + [7] * 5, max_tokens=2, temperature=0)
    second = client.completions.create(model=model, prompt=stem + [8] * 20, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(client.completions.create(model=model, prompt=stem + [9] * 3, max_tokens=2, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 32
    assert _cached_total(live_server) - before == 32


def test_the_next_chat_turn_reuses_the_last(client: openai.OpenAI, model: str) -> None:
    """A chat turn is also cached shortly before its end: the next turn re-renders the end of the
    last one (Qwen3.5's template drops the `<think>` its generation prompt opened), so its prompt
    parts from the last one a few tokens before that one's end. A raw completion is not."""
    system = {"role": "system", "content": "You answer in one word. " * 6}
    client.chat.completions.create(model=model, messages=[system, {"role": "user", "content": "Hi?"}],
                                   max_tokens=2, temperature=0)  # another user of the system prompt
    talk = [system, {"role": "user", "content": "Name a colour of the sea, please."}]
    first = client.chat.completions.create(model=model, messages=talk, max_tokens=4, temperature=0)
    talk += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And another?"}]
    second = client.chat.completions.create(model=model, messages=talk, max_tokens=2, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens == (first.usage.prompt_tokens - 16) // 16 * 16 > 0


def test_a_conversation_the_client_renders_reuses_its_last_turn(client: openai.OpenAI, model: str) -> None:
    """A client that renders the chat template itself and sends text to /v1/completions: a prompt
    that ends opening the assistant's turn is a chat turn too, cached shortly before its end, so
    the next turn, re-rendered, reuses it (before, nothing: the earlier turn's end is rendered anew)."""
    tok = load_tokenizer(default_model_path())
    talk = [{"role": "system", "content": "You answer in two words. " * 5},
            {"role": "user", "content": "Name a colour of the sky, please."}]
    first = client.completions.create(model=model, prompt=render_chat(tok, talk), max_tokens=4, temperature=0)
    talk += [{"role": "assistant", "content": first.choices[0].text}, {"role": "user", "content": "And at night?"}]
    second = client.completions.create(model=model, prompt=render_chat(tok, talk), max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == (first.usage.prompt_tokens - 16) // 16 * 16 > 0


def test_flush_cache_drops_what_the_cache_keeps(live_server: Server, client: openai.OpenAI, model: str) -> None:
    prompt = " ".join(f"f{i}" for i in range(40))
    client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0)
    again = client.completions.create(model=model, prompt=prompt + " x", max_tokens=1, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    for route in ("/flush_cache", "/reset_prefix_cache"):  # SGLang's and vLLM's names
        r = live_server.post(route)
        assert r.status_code == 200 and r.json() == {"message": "Cache flushed."}
        after = client.completions.create(model=model, prompt=prompt + " x", max_tokens=1, temperature=0)
        assert after.usage.prompt_tokens_details.cached_tokens == 0
    stats = live_server.wait_idle()
    assert stats["cached_prefixes"] >= 1 and stats["cached_pages"] >= 1  # the last request cached its prefix
