"""Request bodies of the OpenAI-compatible API (with vLLM/SGLang's common extensions: top_k, min_p,
repetition_penalty, min_tokens, stop_token_ids, ignore_eos, skip_special_tokens, prompt_logprobs,
return_token_ids, chat_template_kwargs). Unknown fields are kept in model_extra and logged, as vLLM
does. Responses are built as plain dicts in responses.py."""
from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field

from minisgl.sampling_params import MAX_LOGPROBS, MAX_PENALTY

MAX_N = 128  # choices per prompt
MAX_CHOICES = 1024  # choices per request, over a batch of prompts
TokenIds = list[int]


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None  # None = the served model
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # -1 or 0 = off
    stop: str | list[str] | None = None
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
    logit_bias: dict[str, float] | None = None  # token id -> bias, clamped to [-100, 100]
    user: str | None = None  # the caller's end-user id: informational

    def unsupported(self) -> list[str]:
        """Fields set to something this server does not implement."""
        return []


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[str], TokenIds, list[TokenIds]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> list[str]:
        bad = super().unsupported() + (["suffix"] if self.suffix else [])
        return bad + (["best_of"] if self.best_of not in (None, 1, self.n) else [])


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None  # "none" | "auto" | "required" | a named function
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> list[str]:
        bad = super().unsupported()
        fmt = (self.response_format or {}).get("type", "text")
        return bad + ([f"response_format {fmt!r}"] if fmt != "text" else [])


class AbortBody(BaseModel):
    rid: str
