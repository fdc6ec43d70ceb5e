"""Chat as Qwen3.5 clients use it, through the real server and the official openai client, on the
tiny model with its Qwen3.5 template: `--reasoning-parser qwen3 --tool-call-parser qwen3_coder`.

The engine follows scripts (tests/scripted_serve.py): a request whose seed names a script decodes
the script's tokens, so the parsers meet known text -- a thinking block closed by its single token
or by a tag split over byte tokens, an unclosed one, a tool call, a malformed one -- streaming and
not. The checkpoint's generation_config.json (written by transformers' GenerationConfig) sets
top_k=1 and max_new_tokens=6, which requests that leave those fields unset must inherit.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import openai
import pytest
from transformers import GenerationConfig

from minisgl.tokenizer.tokenizer import load_tokenizer
from minisgl.models.tiny.default import default_model_path
from server_harness import SERVER_FLAGS, Server, running_server

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
END = "<|im_end|>"
# seed -> the pieces of text the engine emits (each piece tokenized alone, so pieces set token boundaries)
SCRIPTS = {
    101: ["The user wants a greeting.\n", "</think>", "\n\nHello there!", END],
    102: ["Splitting the tag", "\n</th", "ink>", "\n\nDone.", END],  # </think> as byte tokens, split
    103: ["Thinking that never ends"],
    104: ["I should look up the weather.\n", "</think>", "\n\n", CALL, END],
    105: ["The tool says 20 C.\n", "</think>", "\n\nSunny, 20 C.", END],
    106: ["Let me try.\n", "</think>", "\n\n", "<tool_call>\n<function=get_weather>\ncity=Paris\n</tool_call>", END],
    107: ["<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>", END],  # after a forced named call
    108: ["Sure.", END],
    109: ["get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>", END],  # after required
}
OPENER = "<|im_start|>assistant\n<think>\n"


def _script_ids(tok) -> dict[int, list[int]]:
    return {seed: [t for piece in pieces for t in tok.encode(piece, add_special_tokens=False)]
            for seed, pieces in SCRIPTS.items()}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, _isolated_cache: None) -> str:
    """The tiny model with sampling defaults in its generation_config.json."""
    src = default_model_path()
    dst = tmp_path_factory.mktemp("chat") / "tiny"
    shutil.copytree(src, dst)
    gen = GenerationConfig.from_pretrained(src)
    gen.update(do_sample=True, temperature=0.9, top_k=1, max_new_tokens=6)
    gen.save_pretrained(dst)
    return str(dst)


@pytest.fixture(scope="module")
def tok(model_dir: str):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def server(model_dir: str, tok, tmp_path_factory: pytest.TempPathFactory) -> Server:
    # The tools' system turn alone is ~500 byte-level tokens.
    flags = (*SERVER_FLAGS, "--context-length", "1024", "--model-path", model_dir, "--reasoning-parser", "qwen3",
             "--tool-call-parser", "qwen3_coder", "--log-level", "info")  # the sampling-defaults line is info
    env = {"MINISGL_TEST_SCRIPTS": json.dumps(_script_ids(tok))}
    entry = (str(Path(__file__).parents[1] / "scripted_serve.py"),)
    with running_server(tmp_path_factory.mktemp("chat-server"), *flags, entry=entry, env=env) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60, max_retries=0)


def chat(client: openai.OpenAI, seed: int, messages=USER, **kw):  # noqa: ANN001, ANN201
    return client.chat.completions.create(model=client.models.list().data[0].id, messages=messages, seed=seed,
                                          max_tokens=kw.pop("max_tokens", 200), **kw)


def streamed(client: openai.OpenAI, seed: int, **kw) -> tuple[dict, list]:
    """The stream's deltas merged per field, and the chunks."""
    chunks = list(chat(client, seed, stream=True, **kw))
    merged = {"reasoning_content": "", "content": "", "tool_calls": {}}
    for ch in chunks:
        for c in ch.choices:
            d = c.delta
            merged["reasoning_content"] += getattr(d, "reasoning_content", None) or ""
            merged["content"] += d.content or ""
            for call in d.tool_calls or []:
                entry = merged["tool_calls"].setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
    return merged, chunks


def prompt_text(tok, response) -> str:  # noqa: ANN001
    return tok.decode(response.choices[0].model_extra["prompt_token_ids"])


@pytest.mark.parametrize("seed,reasoning,content", [
    (101, "The user wants a greeting.", "Hello there!"),
    (102, "Splitting the tag", "Done."),
])
def test_reasoning_is_split_off(client: openai.OpenAI, seed: int, reasoning: str, content: str) -> None:
    r = chat(client, seed)
    msg = r.choices[0].message
    assert (msg.reasoning_content, msg.content, r.choices[0].finish_reason) == (reasoning, content, "stop")
    merged, chunks = streamed(client, seed)
    assert (merged["reasoning_content"], merged["content"]) == (reasoning, content)
    assert sum(bool(getattr(c.choices[0].delta, "reasoning_content", None)) for c in chunks if c.choices) > 1
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_output_that_ends_inside_the_block(client: openai.OpenAI, tok) -> None:
    n = len(_script_ids(tok)[103])
    r = chat(client, 103, max_tokens=n)
    msg = r.choices[0].message
    assert (msg.reasoning_content, msg.content, r.choices[0].finish_reason) == ("Thinking that never ends", None,
                                                                                 "length")
    merged, _ = streamed(client, 103, max_tokens=n)
    assert (merged["reasoning_content"], merged["content"]) == ("Thinking that never ends", "")


def test_enable_thinking_false_closes_the_block_in_the_prompt(client: openai.OpenAI, tok) -> None:
    on = chat(client, 108, extra_body={"return_token_ids": True})
    off = chat(client, 108, extra_body={"return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False}})
    assert prompt_text(tok, on).endswith(OPENER)
    assert prompt_text(tok, off) == prompt_text(tok, on) + "\n</think>\n\n"
    assert (off.choices[0].message.content, off.choices[0].message.model_extra.get("reasoning_content")) == \
        ("Sure.", None)
    assert on.choices[0].message.reasoning_content == "Sure."  # thinking on: the same words are reasoning


def test_tool_call(client: openai.OpenAI) -> None:
    r = chat(client, 104, tools=[WEATHER])
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert c.message.reasoning_content == "I should look up the weather."
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}  # days typed by the schema
    merged, chunks = streamed(client, 104, tools=[WEATHER])
    (entry,) = merged["tool_calls"].values()
    assert entry["name"] == "get_weather" and json.loads(entry["arguments"]) == {"city": "Paris", "days": 3}
    assert entry["id"].startswith("call_") and merged["content"] == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_round_trip(client: openai.OpenAI, tok) -> None:
    first = chat(client, 104, tools=[WEATHER]).choices[0].message
    call = first.tool_calls[0]
    history = USER + [first.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 20}'}]
    second = chat(client, 105, messages=history, tools=[WEATHER], extra_body={"return_token_ids": True})
    assert second.choices[0].message.content == "Sunny, 20 C." and second.choices[0].finish_reason == "stop"
    assert prompt_text(tok, second).endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI should look up the weather.\n</think>\n\n" + CALL + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"temp\": 20}\n</tool_response><|im_end|>\n" + OPENER
    )


def test_malformed_tool_call_is_content(client: openai.OpenAI) -> None:
    r = chat(client, 106, tools=[WEATHER])
    c = r.choices[0]
    assert c.finish_reason == "stop" and not c.message.tool_calls
    assert c.message.content == "<tool_call>\n<function=get_weather>\ncity=Paris\n</tool_call>"


def test_forced_tool_choices(client: openai.OpenAI, tok) -> None:
    named = chat(client, 107, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 extra_body={"return_token_ids": True})
    assert prompt_text(tok, named).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n")
    assert json.loads(named.choices[0].message.tool_calls[0].function.arguments) == {"city": "Rome"}
    required = chat(client, 109, tools=[WEATHER], tool_choice="required")
    assert required.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert json.loads(required.choices[0].message.tool_calls[0].function.arguments) == {"city": "Oslo"}
    # none: the tools are not offered and nothing is parsed.
    none = chat(client, 104, tools=[WEATHER], tool_choice="none", extra_body={"return_token_ids": True})
    assert "# Tools" not in prompt_text(tok, none)
    assert none.choices[0].message.content == CALL and not none.choices[0].message.tool_calls


@pytest.mark.parametrize("body,match", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
    ({"tool_choice": "required"}, "needs tools"),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, "enable_thinking"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "may not set add_generation_prompt"),
    ({"logit_bias": {"100000": 5}}, "outside the vocabulary"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
])
def test_refusals(server: Server, body: dict, match: str) -> None:
    r = server.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 4, **body})
    assert r.status_code == 400 and match in r.json()["error"]["message"], r.text


def test_sampling_fields_reach_the_engine(client: openai.OpenAI, server: Server) -> None:
    r = chat(client, 7, temperature=0, logit_bias={"40": 100}, max_tokens=5,
             extra_body={"ignore_eos": True, "return_token_ids": True, "repetition_penalty": 1.2, "min_p": 0.1,
                         "presence_penalty": 0.5, "frequency_penalty": 0.5, "min_tokens": 2})
    assert r.choices[0].model_extra["token_ids"] == [40] * 5
    r = server.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, "frobnicate": 1})
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    while "frobnicate" not in server.log_tail() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "request fields this server does not know: frobnicate" in server.log_tail()


def _texts(client: openai.OpenAI, extra: dict | None = None, **kw) -> list[tuple[str, int]]:
    """(text, completion tokens) of one completion for each of three seeds."""
    out = []
    for seed in (1, 2, 3):
        r = client.completions.create(model=client.models.list().data[0].id, prompt="The quick brown fox", seed=seed,
                                      extra_body={"ignore_eos": True, **(extra or {})}, **kw)
        out.append((r.choices[0].text, r.usage.completion_tokens))
    return out


def test_generation_config_defaults(client: openai.OpenAI, server: Server) -> None:
    assert "top_k=1" in server.log_tail(20000) and "max_tokens=6" in server.log_tail(20000)
    inherited = _texts(client)  # top_k=1 and max_new_tokens=6 from generation_config.json
    greedy = _texts(client, temperature=0, max_tokens=6)
    assert inherited == greedy and {n for _, n in inherited} == {6}
    assert len({text for text, _ in _texts(client, extra={"top_k": -1}, max_tokens=6)}) > 1  # the request's wins


def test_generation_config_ignore(model_dir: str, tmp_path: Path) -> None:
    flags = (*SERVER_FLAGS, "--model-path", model_dir, "--generation-config", "ignore")
    with running_server(tmp_path, *flags) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", timeout=60, max_retries=0)
        got = _texts(client)
        # temperature 1, top_k off, max_tokens 16: the API's own defaults
        assert len({text for text, _ in got}) > 1 and {n for _, n in got} == {16}
