"""`--tool-call-parser qwen3_coder`: the Qwen3.5 XML tool calls in the model's answer become
OpenAI `tool_calls`, incrementally as text arrives.

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

A call is emitted whole once its `</tool_call>` arrives, with JSON arguments: each value is typed
by the tool's JSON schema (tool_args.py). Text before the first call is content; whitespace
between calls is dropped. A block that does not parse, or that the output ends inside, is given
back as plain content: the model's words are never lost and never raise.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from minisgl.server.reasoning import held_tail
from minisgl.server.tool_args import typed_arguments

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>\n?(.*?)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def parse_call(body: str, schemas: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The text between <tool_call> and </tool_call> -> {"name", "arguments": {...}}, or None."""
    fn = _FUNCTION.fullmatch(body)
    if fn is None:
        return None
    name, rest = fn.group(1).strip(), fn.group(2)
    args: dict[str, str] = {}
    pos = 0
    while (m := _PARAMETER.match(rest, pos)) is not None:
        key = m.group(1).strip()
        if key in args:
            return None
        args[key] = m.group(2)
        pos = m.end()
    if rest[pos:].strip():
        return None
    return {"name": name, "arguments": typed_arguments(args, schemas.get(name))}


@dataclass
class ToolCalls:
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool_calls entries, with "index"


class Qwen3CoderToolParser:
    def __init__(self, tools: list[dict[str, Any]], max_calls: int | None = None, prefix: str = "") -> None:
        """tools: the request's OpenAI tools; max_calls: 1 for parallel_tool_calls false; prefix:
        text the prompt already wrote for the answer (a forced `<tool_call>` opening)."""
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
        self.max_calls = max_calls
        self.num_calls = 0
        self.inside = False
        self.pending = prefix  # inside: the block so far; outside: a possible opening tag or trailing whitespace
        self.space = ""  # whitespace dropped before the current block, given back if it fails to parse

    def push(self, text: str, final: bool = False) -> ToolCalls:
        """The content and calls this text completes; with final (the output has ended), also what
        is held back: an unclosed block goes back as text."""
        self.pending += text
        out = ToolCalls()
        self._advance(out)
        if final:
            held, self.pending = self.pending, ""
            if self.inside:
                out.content += self.space + held
            elif held.strip() or not self.num_calls:
                out.content += held
        return out

    def _advance(self, out: ToolCalls) -> None:
        while True:
            if self.inside:
                end = self.pending.find(CALL_CLOSE)
                if end < 0:
                    return
                block, self.pending = self.pending[: end + len(CALL_CLOSE)], self.pending[end + len(CALL_CLOSE) :]
                self.inside = False
                self._close(block, out)
                continue
            start = self.pending.find(CALL_OPEN)
            if start >= 0:
                before = self.pending[:start]
                self.space = before[len(before.rstrip()) :]
                out.content += before.rstrip()
                self.pending, self.inside = self.pending[start:], True
                continue
            # Hold a tag that may still be arriving, and trailing whitespace that a call may follow.
            ready = self.pending[: len(self.pending) - held_tail(self.pending, (CALL_OPEN,))].rstrip()
            out.content += ready
            self.pending = self.pending[len(ready) :]
            return

    def _close(self, block: str, out: ToolCalls) -> None:
        call = parse_call(block[len(CALL_OPEN) : -len(CALL_CLOSE)], self.schemas)
        if call is None:
            out.content += self.space + block
            return
        if self.max_calls is not None and self.num_calls >= self.max_calls:
            return  # parallel_tool_calls false: one call per turn
        out.calls.append({
            "index": self.num_calls, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)},
        })
        self.num_calls += 1


TOOL_PARSERS = {"qwen3_coder": Qwen3CoderToolParser}  # --tool-call-parser names (vLLM's and SGLang's)
