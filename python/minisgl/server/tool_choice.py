"""A chat request's `tools`, `tool_choice` and `parallel_tool_calls` -> what the prompt offers, what
the answer is parsed for, and how a required call is enforced.

- `none` (the default without tools): no tools in the prompt, nothing parsed.
- `auto` (the default with tools): tools in the prompt, calls parsed from whatever the model writes.
- `required` and a named function are enforced by the prompt: the answer is prefilled with the
  opening of a call (`<tool_call>\\n<function=`, or the whole `<function=NAME>` line), after an
  empty, closed thinking block when thinking was on. The model then writes the arguments freely:
  they are not constrained to the schema, and a call that does not parse comes back as content.
- `parallel_tool_calls: false` keeps the first call of the answer.

Anything else is refused with a 400, as is any choice but `none` on a server without
`--tool-call-parser`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from minisgl.server.reasoning import THINK_CLOSE, prompt_opens_thinking
from minisgl.server.errors import ApiError
from minisgl.server.openai_types import FUNCTION_NAME
from minisgl.server.tool_parser import CALL_OPEN, TOOL_PARSERS, Qwen3CoderToolParser

_NAME = re.compile(FUNCTION_NAME)


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]] | None  # offered in the prompt
    parser: type[Qwen3CoderToolParser] | None  # what parses the answer for calls (None: nothing)
    forced: str  # the call opening the prompt writes for the answer ("" = not forced)
    max_calls: int | None

    def prompt(self, text: str) -> str:
        """The rendered prompt with the forced call opening, after closing an open thinking block."""
        if not self.forced:
            return text
        return text + ("\n" + THINK_CLOSE + "\n\n" if prompt_opens_thinking(text) else "") + self.forced

    def new_parser(self) -> Qwen3CoderToolParser | None:
        """A fresh parser for one choice's answer."""
        return self.parser(self.tools or [], self.max_calls, self.forced) if self.parser else None


def _check_tools(tools: list[dict[str, Any]]) -> None:
    names = set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise ApiError(400, f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ApiError(400, f"tools[{i}].function.name must match {_NAME.pattern}, got {name!r}", "tools")
        if name in names:
            raise ApiError(400, f"tools[{i}].function.name {name!r} is offered twice", "tools")
        if not isinstance(fn.get("parameters", {}), dict):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        names.add(name)


def _named(choice: Any) -> str | None:
    """The function a named choice names (None for "none", "auto", "required"); 400 for any other shape."""
    if choice in ("none", "auto", "required"):
        return None
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, 'tool_choice must be "none", "auto", "required" or '
                            '{"type": "function", "function": {"name": ...}}', "tool_choice")
    return name


def plan_tools(
    tools: list[dict[str, Any]] | None, tool_choice: Any, parallel_tool_calls: bool, parser: str | None
) -> ToolPlan:
    tools = tools or None
    if tools:
        _check_tools(tools)
    choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
    name = _named(choice)  # the shape first: a malformed choice is malformed with or without tools
    if choice == "none":
        return ToolPlan(None, None, "", None)
    if not tools:
        raise ApiError(400, f"tool_choice {choice!r} needs tools", "tool_choice")
    if parser is None:
        raise ApiError(400, "tool calls need a server started with --tool-call-parser (qwen3_coder for Qwen3.5)",
                       "tools")
    cls, max_calls = TOOL_PARSERS[parser], None if parallel_tool_calls else 1
    if choice == "auto":
        return ToolPlan(tools, cls, "", max_calls)
    if choice == "required":
        return ToolPlan(tools, cls, CALL_OPEN + "\n<function=", max_calls)
    if name not in {t["function"]["name"] for t in tools}:
        raise ApiError(400, f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
    return ToolPlan(tools, cls, f"{CALL_OPEN}\n<function={name}>\n", max_calls)
