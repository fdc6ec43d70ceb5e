"""OpenAI chat messages (and tools) -> the model's prompt text, via the checkpoint's chat template."""
from __future__ import annotations

import inspect
import json
from functools import lru_cache
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.meta
from transformers import PreTrainedTokenizerBase

ROLES = ("system", "developer", "user", "assistant", "tool")
# What apply_chat_template itself takes: template kwargs may not smuggle these in.
RESERVED_TEMPLATE_KWARGS = frozenset(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters) | {"messages"}


def _text(content: str | Sequence[Any] | None, i: int) -> str:
    """A message's content as text: a string, or a list of text parts (other parts need a vision model)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"messages[{i}].content: only text parts are supported, got {kind!r}")
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's tool_calls with each function's JSON-string arguments parsed into an
    object, which is what templates render parameter by parameter."""
    if not isinstance(calls, list):
        raise ValueError(f"messages[{i}].tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"messages[{i}].tool_calls[{j}].function.name is required")
        if not isinstance(call.get("id", ""), str) or call.get("type", "function") != "function":
            raise ValueError(f"messages[{i}].tool_calls[{j}]: id must be a string and type 'function'")
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            raise ValueError(f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON string or object")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except json.JSONDecodeError as e:
                raise ValueError(f"messages[{i}].tool_calls[{j}].function.arguments is not JSON: {e}") from None
        if not isinstance(args, dict):
            raise ValueError(f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON object")
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def _message(m: dict[str, Any], i: int) -> dict[str, Any]:
    role = m.get("role")
    if role not in ROLES:
        raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
    out = {**m, "role": "system" if role == "developer" else role, "content": _text(m.get("content"), i)}
    if m.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(m["tool_calls"], i)
    return out


@lru_cache(maxsize=8)
def template_variables(template: str) -> frozenset[str]:
    """The variables a chat template reads from its context."""
    return frozenset(jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template)))


def unused_template_kwargs(tokenizer: PreTrainedTokenizerBase, kwargs: Mapping[str, Any]) -> list[str]:
    """The chat_template_kwargs this model's template never reads (they would change nothing)."""
    used = template_variables(tokenizer.chat_template or "")
    return sorted(k for k in kwargs if k not in used)


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for `messages`, ending with the assistant's turn opened. The developer role
    is the system role; template_kwargs are the request's chat_template_kwargs. Raises ValueError."""
    template_kwargs = dict(template_kwargs or {})
    if not messages:
        raise ValueError("messages must contain at least one message")
    if not tokenizer.chat_template:
        raise ValueError("this model has no chat template; use /v1/completions")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(template_kwargs))
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)}")
    if not isinstance(template_kwargs.get("enable_thinking", False), bool):
        raise ValueError("chat_template_kwargs.enable_thinking must be true or false")
    plain = [_message(m, i) for i, m in enumerate(messages)]
    try:
        return tokenizer.apply_chat_template(
            plain, tools=list(tools) if tools else None, tokenize=False, add_generation_prompt=True, **template_kwargs
        )
    except Exception as e:  # a template's own raise_exception(), or a jinja error: the messages are at fault
        raise ValueError(f"the chat template rejected these messages: {e}") from e


def generation_prompts(tokenizer: PreTrainedTokenizerBase) -> tuple[tuple[int, ...], ...]:
    """The token ids the chat template appends to open the assistant's turn, with thinking on and
    off where the template has that switch (Qwen3.5: `<|im_start|>assistant\n<think>\n`, or that
    and an empty think block): a prompt a client rendered with the template for the model's next
    turn ends with one of them. () without a template, or one that cannot render a lone user message."""
    template = tokenizer.chat_template
    if not template or not isinstance(template, str):
        return ()
    probe = [{"role": "user", "content": "x"}]
    switches: list[dict[str, bool]] = [{}]
    if "enable_thinking" in template_variables(template):
        switches += [{"enable_thinking": True}, {"enable_thinking": False}]
    found = set()
    try:
        base = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
        head = tokenizer.encode(base, add_special_tokens=False)
        for switch in switches:
            text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **switch)
            full = tokenizer.encode(text, add_special_tokens=False)
            if len(full) > len(head) and full[: len(head)] == head:
                found.add(tuple(full[len(head) :]))
    except jinja2.TemplateError:
        return ()
    return tuple(sorted(found))


def opens_assistant_turn(prompt: Sequence[int], openings: Sequence[tuple[int, ...]]) -> bool:
    """Whether `prompt` ends with one of generation_prompts' openings (and holds more than it)."""
    return any(len(prompt) > len(o) and tuple(prompt[-len(o) :]) == o for o in openings)
