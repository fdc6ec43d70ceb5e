"""The reasoning (qwen3) and tool-call (qwen3_coder) parsers on text, as one piece and split at every
character: streaming must give the non-streaming answer whatever the pieces, hold back tags that
are still arriving, and give malformed calls back as content."""
from __future__ import annotations

import json

import pytest

from minisgl.server.chat_stream import ChoiceStream
from minisgl.server.reasoning import Qwen3ReasoningParser, prompt_opens_thinking
from minisgl.server.tool_args import typed_value
from minisgl.server.tool_choice import plan_tools
from minisgl.server.tool_parser import Qwen3CoderToolParser
from minisgl.server.errors import ApiError

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "hours": {"type": "array"}, "extra": {"type": "object"}, "scale": {"type": "number"},
    "note": {"type": ["string", "null"]}, "code": {"type": "string"}}}}}]
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
        "<parameter=hours>\n[9, 12]\n</parameter>\n<parameter=extra>\n{\"a\": {\"b\": null}}\n</parameter>\n"
        "<parameter=scale>\n1.5\n</parameter>\n<parameter=code>\n007\n</parameter>\n</function>\n</tool_call>")
ARGS = {"city": "San Francisco", "days": 3, "metric": True, "hours": [9, 12], "extra": {"a": {"b": None}},
        "scale": 1.5, "code": "007"}


def run(text: str, pieces: list[int] | None, prompt_opens: bool = True, tools: list | None = TOOLS,
        max_calls: int | None = None, prefix: str = "", reasoning: bool = True) -> dict:
    """Feed text cut at the given offsets (None: one piece); return the merged message."""
    cuts = [0, *(pieces or []), len(text)]
    stream = ChoiceStream(Qwen3ReasoningParser(prompt_opens) if reasoning else None,
                          Qwen3CoderToolParser(tools, max_calls, prefix) if tools is not None else None)
    merged: dict = {"reasoning_content": "", "content": "", "tool_calls": []}
    parts = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    for i, part in enumerate(parts):
        delta = stream.push(part, finished=i == len(parts) - 1)
        for k, v in delta.items():
            merged[k] += v
    merged["tool_calls"] = [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                            for c in merged["tool_calls"]]
    return merged


def every_split(text: str, **kw) -> dict:
    """The answer for each single cut point, and for one character at a time, equals the whole."""
    whole = run(text, None, **kw)
    assert run(text, list(range(1, len(text))), **kw) == whole
    for cut in range(1, len(text)):
        assert run(text, [cut], **kw) == whole, cut
    return whole


def test_thinking_opened_by_the_prompt() -> None:
    text = "Let me think.\n\nIt is sunny.\n</think>\n\nSunny, 20 C."
    assert every_split(text) == {"reasoning_content": "Let me think.\n\nIt is sunny.", "content": "Sunny, 20 C.",
                                 "tool_calls": []}


def test_thinking_opened_by_the_model() -> None:
    text = "\n<think>\nHmm.\n</think>\n\nYes."
    assert every_split(text, prompt_opens=False) == {"reasoning_content": "Hmm.", "content": "Yes.", "tool_calls": []}
    # With the block closed in the prompt (enable_thinking false), plain text is content.
    assert every_split("Yes <think> is a tag.", prompt_opens=False)["content"] == "Yes <think> is a tag."


def test_output_ending_inside_the_block_is_all_reasoning() -> None:
    assert every_split("Still thinking\n\n</thi") == {"reasoning_content": "Still thinking\n\n</thi", "content": "",
                                                      "tool_calls": []}


def test_a_tool_call_ends_the_thinking_block() -> None:
    got = every_split("I need the weather.\n" + CALL)
    assert got == {"reasoning_content": "I need the weather.", "content": "", "tool_calls": [(0, "get_weather", ARGS)]}


def test_calls_after_content_and_several_in_one_turn() -> None:
    text = "Plan.\n</think>\n\nChecking both.\n\n" + CALL + "\n" + CALL.replace("San Francisco", "Oslo")
    got = every_split(text)
    assert got["reasoning_content"] == "Plan." and got["content"] == "Checking both."
    assert got["tool_calls"] == [(0, "get_weather", ARGS), (1, "get_weather", {**ARGS, "city": "Oslo"})]
    assert run(text, None, max_calls=1)["tool_calls"] == [(0, "get_weather", ARGS)]  # parallel_tool_calls false


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",  # unclosed parameter
        "<tool_call>\nget_weather(city='Paris')\n</tool_call>",  # not the XML
        "<tool_call>\n<function=get_weather>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n"
        "</function>\n</tool_call>",  # the same argument twice
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>",  # output ends inside
    ],
)
def test_malformed_calls_come_back_as_content(bad: str) -> None:
    text = "Answer:\n\n" + bad
    got = every_split(text, prompt_opens=False)
    assert got == {"reasoning_content": "", "content": text, "tool_calls": []}


def test_a_good_call_next_to_a_bad_one() -> None:
    bad = "<tool_call>\n<function=get_weather>\nnonsense\n</tool_call>"
    got = every_split(CALL + "\n" + bad, prompt_opens=False)
    assert got["tool_calls"] == [(0, "get_weather", ARGS)] and got["content"] == "\n" + bad


def test_forced_call_opening_from_the_prompt() -> None:
    tail = "get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"
    got = run(tail, None, prompt_opens=False, prefix="<tool_call>\n<function=")
    assert got["tool_calls"] == [(0, "get_weather", {"city": "Rome"})] and got["content"] == ""


def test_values_are_typed_by_the_schema() -> None:
    assert typed_value("3", {"type": "integer"}) == 3
    assert typed_value("3", {"type": "string"}) == "3"
    assert typed_value("3.0", {"type": "number"}) == 3.0 and typed_value("-2", {"type": "number"}) == -2
    assert typed_value("False", {"type": "boolean"}) is False
    assert typed_value("null", {"type": ["integer", "null"]}) is None
    assert typed_value("7", {"anyOf": [{"type": "null"}, {"type": "integer"}]}) == 7
    assert typed_value("many", {"type": "integer"}) == "many"  # not an integer: the text the model wrote
    assert typed_value("[1", {"type": "array"}) == "[1"
    assert typed_value("{}", None) == "{}"  # no schema: a string


def test_prompt_opens_thinking() -> None:
    assert prompt_opens_thinking("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>user\n<think>\n<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "tools,choice,parser,match",
    [
        (TOOLS, "auto", None, "--tool-call-parser"),
        (None, "required", "qwen3_coder", "needs tools"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "qwen3_coder", "not among the tools"),
        (TOOLS, "sometimes", "qwen3_coder", "tool_choice must be"),
        (None, {}, "qwen3_coder", "tool_choice must be"),  # the shape before the cross-field rule
        ([{"type": "function", "function": {"name": "a b"}}], "auto", "qwen3_coder", "must match"),
        ([{"type": "code_interpreter"}], "auto", "qwen3_coder", r"tools\[0\] must be"),
        (TOOLS + TOOLS, "auto", "qwen3_coder", "offered twice"),
    ],
)
def test_tool_choice_refusals(tools, choice, parser, match) -> None:
    with pytest.raises(ApiError, match=match):
        plan_tools(tools, choice, True, parser)


def test_tool_choice_plans() -> None:
    assert plan_tools(TOOLS, "none", True, None).tools is None  # none: not offered, nothing parsed
    assert plan_tools(None, None, True, None).new_parser() is None
    auto = plan_tools(TOOLS, None, False, "qwen3_coder")
    assert auto.tools == TOOLS and auto.forced == "" and auto.max_calls == 1
    named = plan_tools(TOOLS, {"type": "function", "function": {"name": "get_weather"}}, True, "qwen3_coder")
    opened = "<|im_start|>assistant\n<think>\n"
    assert named.prompt(opened) == opened + "\n</think>\n\n<tool_call>\n<function=get_weather>\n"
    required = plan_tools(TOOLS, "required", True, "qwen3_coder")
    assert required.prompt("x<think>\n\n</think>\n\n") == "x<think>\n\n</think>\n\n<tool_call>\n<function="
