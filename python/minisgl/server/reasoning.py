"""`--reasoning-parser qwen3`: a Qwen3-style thinking block in the model's output becomes
`reasoning_content`, the rest `content`, incrementally as text arrives.

The block runs from `<think>` to `</think>`; the Qwen3.5 generation prompt usually opens it
itself (then the output starts inside it), and a `<tool_call>` also ends an unclosed block. The
newlines the chat format puts around the block (`<think>\\n` ... `\\n</think>\\n\\n`) are
separators, not text: they are dropped, so reasoning and content read as the template writes
them back. A tag may arrive split over several pieces of text; the parser holds back any tail
that could still become one. Output that ends inside the block is all reasoning.
"""
from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TURN_START = "<|im_start|>"
_BEFORE, _THINKING, _AFTER = "before", "thinking", "after"


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the prompt's last turn leaves a thinking block open, so the output starts inside it."""
    turn = prompt[max(prompt.rfind(TURN_START), 0) :]
    return turn.rfind(THINK_OPEN) > turn.rfind(THINK_CLOSE)


def held_tail(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of text that is a proper beginning of one of the markers."""
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


@dataclass
class Split:
    reasoning: str = ""
    content: str = ""


class Qwen3ReasoningParser:
    def __init__(self, prompt_opens_block: bool) -> None:
        """prompt_opens_block: the prompt left a thinking block open (prompt_opens_thinking)."""
        self.state = _THINKING if prompt_opens_block else _BEFORE
        self.pending = ""  # text not yet classified: a possible tag, or newlines that may be separators
        self.reasoning_started = False
        self.content_started = False

    def push(self, text: str, final: bool = False) -> Split:
        """The reasoning and content this text completes; with final (the output has ended), also
        everything held back."""
        self.pending += text
        out = Split()
        self._advance(out)
        if final:
            if self.state == _THINKING:
                out.reasoning += self._reasoning(self.pending.rstrip("\n"))
            else:
                out.content += self._content(self.pending)
            self.pending = ""
        return out

    def _advance(self, out: Split) -> None:
        while True:
            if self.state == _BEFORE:
                head = self.pending.lstrip()
                if head.startswith(THINK_OPEN):  # the model opened the block itself
                    self.pending, self.state = head[len(THINK_OPEN) :], _THINKING
                elif THINK_OPEN.startswith(head):  # nothing yet, or a tag still arriving
                    return
                else:
                    self.state = _AFTER
            elif self.state == _THINKING:
                ends = [(i, m) for m in (THINK_CLOSE, TOOL_CALL_OPEN) if (i := self.pending.find(m)) >= 0]
                if not ends:
                    # Hold a tag that may still be arriving, and newlines that may turn out to be
                    # the separator before </think>.
                    ready = self.pending[: len(self.pending) - held_tail(self.pending, (THINK_CLOSE, TOOL_CALL_OPEN))]
                    ready = ready.rstrip("\n")
                    out.reasoning += self._reasoning(ready)
                    self.pending = self.pending[len(ready) :]
                    return
                i, marker = min(ends)
                out.reasoning += self._reasoning(self.pending[:i].rstrip("\n"))
                # </think> is consumed; a tool call is the answer's and stays in the text.
                self.pending = self.pending[i + len(THINK_CLOSE) :] if marker == THINK_CLOSE else self.pending[i:]
                self.state = _AFTER
            else:
                out.content += self._content(self.pending)
                self.pending = ""
                return

    def _reasoning(self, text: str) -> str:
        """Reasoning text, minus the separator newlines after <think>."""
        if not self.reasoning_started:
            text = text.lstrip("\n")
            self.reasoning_started = bool(text)
        return text

    def _content(self, text: str) -> str:
        """Content text, minus the separator newlines after </think>."""
        if not self.content_started:
            text = text.lstrip("\n")
            self.content_started = bool(text)
        return text


REASONING_PARSERS = {"qwen3": Qwen3ReasoningParser}  # --reasoning-parser names (vLLM's and SGLang's)
