"""The request body of SGLang's native POST /generate (its GenerateReqInput and SamplingParams, the
fields this server runs). A sampling parameter it does not know is refused, as SGLang's own
SamplingParams refuses it; one it knows but does not implement (constrained decoding, images,
LoRA) is a 400 naming it."""
from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field

from minisgl.sampling_params import MAX_LOGPROBS, MAX_PENALTY
from minisgl.server.openai_types import MAX_N, STRICT, NonEmptyStr, SamplingFields, TokenIdKey, TokenIds

# SGLang's max_new_tokens when a request and the checkpoint's generation_config leave it unset.
DEFAULT_MAX_NEW_TOKENS = 128
# SamplingFields (OpenAI) names that /generate's sampling parameters share.
_SHARED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
           "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "logit_bias", "n")


class GenerateSampling(BaseModel):
    model_config = ConfigDict(STRICT, extra="forbid")

    max_new_tokens: int | None = Field(None, ge=0)
    min_new_tokens: int = Field(0, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # -1 or 0 = off
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    presence_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    stop: NonEmptyStr | list[NonEmptyStr] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = Field(1, ge=1, le=MAX_N)
    logit_bias: dict[TokenIdKey, float] | None = None
    sampling_seed: int | None = None
    # Known to SGLang, not run here: set to anything but their defaults, a 400.
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    custom_params: dict[str, Any] | None = None

    def unsupported(self) -> list[str]:
        bad = [name for name in ("json_schema", "regex", "ebnf", "structural_tag", "custom_params")
               if getattr(self, name) is not None]
        bad += [] if self.spaces_between_special_tokens else ["spaces_between_special_tokens"]
        return bad + (["no_stop_trim"] if self.no_stop_trim else [])

    def as_openai(self) -> SamplingFields:
        """The OpenAI routes' fields with what this request set (unset ones stay unset, so the
        checkpoint's generation_config still defaults them)."""
        kw = {name: getattr(self, name) for name in _SHARED if name in self.model_fields_set}
        if "min_new_tokens" in self.model_fields_set:
            kw["min_tokens"] = self.min_new_tokens
        if "sampling_seed" in self.model_fields_set:
            kw["seed"] = self.sampling_seed
        return SamplingFields(**kw)


class GenerateRequestBody(BaseModel):
    model_config = ConfigDict(STRICT, extra="allow")  # unknown fields are logged, as on the OpenAI routes

    text: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Field(min_length=1)], None] = None
    input_ids: Union[TokenIds, Annotated[list[TokenIds], Field(min_length=1)], None] = None
    sampling_params: Union[GenerateSampling, Annotated[list[GenerateSampling], Field(min_length=1)], None] = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # SGLang's bench sends it; the stream's shape does not change
    return_logprob: bool = False
    logprob_start_len: int = Field(-1, ge=-1)  # -1: the output tokens' logprobs only
    top_logprobs_num: int = Field(0, ge=0, le=MAX_LOGPROBS)
    return_text_in_logprobs: bool = False
    rid: str | None = None
    # Known to SGLang, not run here: set, a 400.
    image_data: Any = None
    audio_data: Any = None
    video_data: Any = None
    input_embeds: Any = None
    lora_path: Any = None
    session_params: Any = None
    custom_logit_processor: Any = None
    return_hidden_states: bool = False

    def unsupported(self) -> list[str]:
        names = ("image_data", "audio_data", "video_data", "input_embeds", "lora_path", "session_params",
                 "custom_logit_processor")
        bad = [name for name in names if getattr(self, name) is not None]
        return bad + (["return_hidden_states"] if self.return_hidden_states else [])
