"""Request bodies of the OpenAI-compatible API (with vLLM/SGLang's common extensions: top_k,
stop_token_ids, ignore_eos, skip_special_tokens, prompt_logprobs, return_token_ids). Unknown fields are ignored, as
vLLM does. Responses are built as plain dicts in responses.py."""
from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field

from minisgl.sampling_params import MAX_LOGPROBS

MAX_N = 128  # choices per prompt
MAX_CHOICES = 1024  # choices per request, over a batch of prompts
# The schema states the minimum lengths the server enforces: no empty prompt, no empty message list.
NonEmptyStr = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


# Strict: a value of the wrong JSON type is refused, as the schema says, never coerced ("1" -> 1, 0 -> false).
STRICT = ConfigDict(strict=True, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(STRICT, extra="ignore")

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
    # Accepted for compatibility; anything but the neutral value is rejected with a message.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def unsupported(self) -> list[str]:
        """Fields set to something this server does not implement."""
        bad = [f for f in ("presence_penalty", "frequency_penalty") if getattr(self, f) != 0]
        return bad + (["logit_bias"] if self.logit_bias else [])


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


class ChatMessage(BaseModel):
    model_config = ConfigDict(STRICT, extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> list[str]:
        bad = super().unsupported() + (["tools"] if self.tools else [])
        fmt = (self.response_format or {}).get("type", "text")
        return bad + ([f"response_format {fmt!r}"] if fmt != "text" else [])


class AbortBody(BaseModel):
    model_config = STRICT

    rid: str
