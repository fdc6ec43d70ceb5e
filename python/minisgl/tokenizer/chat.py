"""OpenAI chat messages -> the model's prompt text, via the checkpoint's chat template."""
from __future__ import annotations

from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

ROLES = ("system", "developer", "user", "assistant", "tool")


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


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], **template_kwargs: Any) -> str:
    """The prompt text for `messages`, ending with the assistant's turn opened. Raises ValueError."""
    if not messages:
        raise ValueError("messages must contain at least one message")
    if not tokenizer.chat_template:
        raise ValueError("this model has no chat template; use /v1/completions")
    plain = []
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        plain.append({**m, "content": _text(m.get("content"), i)})
    try:
        return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True, **template_kwargs)
    except Exception as e:  # a template's own raise_exception(), or a jinja error: the messages are at fault
        raise ValueError(f"the chat template rejected these messages: {e}") from e
