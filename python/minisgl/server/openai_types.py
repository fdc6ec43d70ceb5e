"""Request bodies of the OpenAI-compatible API (with vLLM/SGLang's common extensions: top_k, min_p,
repetition_penalty, min_tokens, stop_token_ids, ignore_eos, skip_special_tokens, prompt_logprobs,
return_token_ids, chat_template_kwargs). Unknown fields are kept in model_extra and logged, as vLLM
does. Responses are built as plain dicts in responses.py."""
from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from minisgl.sampling_params import MAX_LOGPROBS, MAX_PENALTY
from minisgl.tokenizer.chat import RESERVED_TEMPLATE_KWARGS

MAX_N = 128  # choices per prompt
MAX_CHOICES = 1024  # choices per request, over a batch of prompts
# The schema states the minimum lengths the server enforces: no empty prompt, no empty message list.
NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
TokenIdKey = Annotated[str, Field(pattern=r"^[0-9]+$")]  # JSON object keys are strings: a token id in decimal


# Strict: a value of the wrong JSON type is refused, as the schema says, never coerced ("1" -> 1, 0 -> false).
STRICT = ConfigDict(strict=True, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(STRICT, extra="allow")  # unknown fields are logged, never silently dropped

    model: str | None = None  # None = the served model
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # -1 or 0 = off
    stop: NonEmptyStr | list[NonEmptyStr] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    return_token_ids: bool = False  # vLLM: token_ids per choice, prompt_token_ids once
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    presence_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    min_tokens: int = Field(0, ge=0)
    logit_bias: dict[TokenIdKey, float] | None = None  # token id -> bias, clamped to [-100, 100]
    user: str | None = None  # the caller's end-user id: informational

    def unsupported(self) -> list[str]:
        """Fields set to something this server does not implement."""
        return []


class CompletionRequest(SamplingFields):
    prompt: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Field(min_length=1)], TokenIds,
                  Annotated[list[TokenIds], Field(min_length=1)]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> list[str]:
        bad = super().unsupported() + (["suffix"] if self.suffix else [])
        return bad + (["best_of"] if self.best_of not in (None, 1, self.n) else [])


FUNCTION_NAME = r"[A-Za-z0-9_.\-]{1,64}"  # OpenAI's function names (and '.'), safe inside the XML
# A tool's shape, stated in the schema for clients and fuzzers; tool_choice.py checks it at run time
# (with the cross-field rule a schema cannot state: names offered once).
Tool = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "required": ["type", "function"],
    "properties": {"type": {"const": "function"}, "function": {
        "type": "object", "required": ["name"],
        "properties": {"name": {"type": "string", "pattern": f"^{FUNCTION_NAME}$"}, "description": {"type": "string"},
                       "parameters": {"type": "object"}}}}})]

# "none" | "auto" | "required" | a named function, stated for clients and fuzzers; tool_choice.py
# checks it at run time, with the cross-field rules a schema cannot state (tools given, the name
# among them).
ToolChoice = Annotated[Union[str, dict[str, Any]], WithJsonSchema({"anyOf": [
    {"type": "string", "enum": ["none", "auto", "required"]},
    {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string", "pattern": f"^{FUNCTION_NAME}$"}}}}},
]})]


# An assistant message's earlier tool calls, stated for clients and fuzzers; tokenizer/chat.py checks
# them at run time, with the rule a schema cannot state: a string of arguments holds a JSON object.
ToolCalls = Annotated[Any, WithJsonSchema({"type": "array", "items": {
    "type": "object", "required": ["function"],
    "properties": {"id": {"type": "string"}, "type": {"const": "function"}, "function": {
        "type": "object", "required": ["name"],
        "properties": {"name": {"type": "string"},
                       "arguments": {"anyOf": [{"type": "string", "contentMediaType": "application/json"},
                                               {"type": "object"}]}}}}}})]


# The chat template's own variables, passed through to it; stated for clients and fuzzers, checked by
# tokenizer/chat.py: enable_thinking is a boolean, and the arguments of apply_chat_template itself
# are refused (propertyNames says it for clients; fuzzers read the "not", as they ignore propertyNames).
_RESERVED = sorted(RESERVED_TEMPLATE_KWARGS)
ChatTemplateKwargs = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "properties": {"enable_thinking": {"type": "boolean"}},
    "propertyNames": {"not": {"enum": _RESERVED}},
    "not": {"anyOf": [{"required": [name]} for name in _RESERVED]}})]


class ChatMessage(BaseModel):
    model_config = ConfigDict(STRICT, extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: ToolCalls | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: ChatTemplateKwargs | None = None  # e.g. {"enable_thinking": false}
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> list[str]:
        bad = super().unsupported()
        fmt = (self.response_format or {}).get("type", "text")
        return bad + ([f"response_format {fmt!r}"] if fmt != "text" else [])


class AbortBody(BaseModel):
    model_config = STRICT

    rid: str
