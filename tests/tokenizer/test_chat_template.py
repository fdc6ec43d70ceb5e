"""The embedded tiny model's chat template against the Qwen3.5 chat format, fact by fact: ChatML
turns, the thinking opener and enable_thinking, tools in the system turn, XML tool calls in the
history, tool results in one user turn, reasoning kept only after the last real user query. The
expected prompts are written out by hand from the format, never produced by the template."""
from __future__ import annotations

import json

import pytest

from minisgl.tokenizer.chat import generation_prompts, opens_assistant_turn, render_chat, unused_template_kwargs
from minisgl.tokenizer.tokenizer import load_tokenizer
from minisgl.models.tiny.default import default_model_path
from minisgl.models.tiny.tokenizer import CHAT_TOKENS

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
OPEN = "<|im_start|>assistant\n<think>\n"
CLOSED = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(default_model_path())


def test_turns_and_the_thinking_opener(tok) -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    turns = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert render_chat(tok, msgs) == turns + OPEN
    assert render_chat(tok, msgs, template_kwargs={"enable_thinking": True}) == turns + OPEN
    # enable_thinking false changes exactly the opener: an empty, closed block.
    assert render_chat(tok, msgs, template_kwargs={"enable_thinking": False}) == turns + CLOSED
    # OpenAI's developer role is the system role.
    assert render_chat(tok, [{"role": "developer", "content": "Be brief."}, msgs[1]]) == turns + OPEN


def test_chat_tokens_are_single_tokens(tok) -> None:
    for t in CHAT_TOKENS:
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    ids = tok.encode(render_chat(tok, USER), add_special_tokens=False)
    assert ids[-2:] == tok.encode("<think>\n", add_special_tokens=False)
    # Not special: skip_special_tokens keeps them in the text the parsers read.
    assert tok.decode(tok.encode("<think>a</think><tool_call>"), skip_special_tokens=True) == \
        "<think>a</think><tool_call>"


def test_tools_are_listed_in_the_system_turn(tok) -> None:
    text = render_chat(tok, [{"role": "system", "content": "Be brief."}, *USER], [WEATHER, CLOCK])
    assert text.startswith("<|im_start|>system\n# Tools\n\n")
    block = text[text.index("<tools>\n") + len("<tools>\n") : text.index("\n</tools>")]
    assert [json.loads(line) for line in block.split("\n")] == [WEATHER, CLOCK]
    assert "<tool_call>\n<function=" in text and "<parameter=" in text  # the call syntax is explained
    # The request's own system message follows the tools, in the same turn.
    system = text[: text.index("<|im_end|>")]
    assert system.endswith("\n\nBe brief.") and text.count("<|im_start|>system") == 1
    assert text.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n" + OPEN)
    no_system = render_chat(tok, USER, [WEATHER])
    assert no_system.startswith("<|im_start|>system\n# Tools\n\n") and "Be brief." not in no_system


def test_tool_calls_and_results_in_the_history(tok) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3,
                                                                         "opts": {"units": "C"}})}}
    msgs = USER + [
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Need the tool.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "20 C"},
    ]
    text = render_chat(tok, msgs, [WEATHER])
    want = (
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\nChecking.\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"units\": \"C\"}\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n20 C\n</tool_response>"
        "<|im_end|>\n" + OPEN
    )
    assert text.endswith(want)
    # Two calls in one turn, no content: one after the other.
    two = render_chat(tok, USER + [{"role": "assistant", "content": None, "tool_calls": [call, call]}], [WEATHER])
    assert "<|im_start|>assistant\n<tool_call>\n" in two and "</tool_call>\n<tool_call>\n" in two


def test_reasoning_is_kept_only_after_the_last_user_query(tok) -> None:
    msgs = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>\nr2\n</think>\n\na2"},  # reasoning inside the content
        {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},  # not a real query
    ]
    text = render_chat(tok, msgs)
    assert "<|im_start|>assistant\na1<|im_end|>\n" in text  # before the last query: content alone
    assert "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n" in text


@pytest.mark.parametrize(
    "msgs,kwargs,match",
    [
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "late"}], {}, "system message"),
        (USER + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{nope"}}]}], {},
         "not JSON"),
        (USER + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}], {},
         "JSON object"),
        (USER + [{"role": "assistant", "tool_calls": {"function": {"name": "f"}}}], {}, "must be a list"),
        (USER + [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}], {}, "name is required"),
        (USER + [{"role": "assistant", "tool_calls": [{"id": 7, "function": {"name": "f"}}]}], {}, "id must be a string"),
        (USER + [{"role": "assistant", "tool_calls": [{"type": "tool", "function": {"name": "f"}}]}], {},
         "type 'function'"),
        (USER + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}], {},
         "JSON string or object"),
        (USER, {"add_generation_prompt": False}, "may not set add_generation_prompt"),
        (USER, {"tools": []}, "may not set tools"),
        (USER, {"enable_thinking": "no"}, "enable_thinking must be true or false"),
    ],
)
def test_bad_messages(tok, msgs, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        render_chat(tok, msgs, template_kwargs=kwargs)


def test_unused_template_kwargs(tok) -> None:
    assert unused_template_kwargs(tok, {"enable_thinking": False, "thinking": True}) == ["thinking"]


def test_generation_prompts_are_the_openers_with_thinking_on_and_off(tok) -> None:
    """What a client that renders the template itself ends a prompt with, for the model's turn."""
    openings = generation_prompts(tok)
    assert sorted(tok.decode(o) for o in openings) == sorted([OPEN, CLOSED])
    for kwargs in ({}, {"enable_thinking": False}):
        prompt = tok.encode(render_chat(tok, USER, template_kwargs=kwargs), add_special_tokens=False)
        assert opens_assistant_turn(prompt, openings)
        assert not opens_assistant_turn(prompt + [prompt[-2]], openings)  # the model's turn has begun
    assert not opens_assistant_turn(tok.encode(OPEN, add_special_tokens=False), openings)  # nothing before it
    bare = load_tokenizer(default_model_path())
    bare.chat_template = None
    assert generation_prompts(bare) == ()
