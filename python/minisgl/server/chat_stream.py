"""One chat choice's text, as it arrives, -> OpenAI message deltas: the reasoning parser splits
off the thinking, the tool-call parser takes calls out of the rest, and what remains is content.
Without parsers the text is all content."""
from __future__ import annotations

from typing import Any

from minisgl.server.reasoning import Qwen3ReasoningParser
from minisgl.server.tool_parser import Qwen3CoderToolParser


class ChoiceStream:
    def __init__(self, reasoning: Qwen3ReasoningParser | None, tools: Qwen3CoderToolParser | None) -> None:
        self.reasoning, self.tools = reasoning, tools

    @property
    def called_tools(self) -> bool:
        return self.tools is not None and self.tools.num_calls > 0

    def push(self, text: str, finished: bool) -> dict[str, Any]:
        """The delta fields this text completes (none, some or all of reasoning_content, content,
        tool_calls); with finished, everything still held back too."""
        reasoning, content = "", text
        if self.reasoning is not None:
            split = self.reasoning.push(text, finished)
            reasoning, content = split.reasoning, split.content
        calls: list[dict[str, Any]] = []
        if self.tools is not None:
            parsed = self.tools.push(content, finished)
            content, calls = parsed.content, parsed.calls
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta
