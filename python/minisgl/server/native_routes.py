"""SGLang's native routes that scripts call beside the OpenAI API, with SGLang's shapes:

    POST /tokenize     {"prompt": str | [str] | "messages": [...], "add_special_tokens"} -> {"tokens", "count", "max_model_len"}
    POST /detokenize   {"tokens": [int] | [[int]], "skip_special_tokens"} -> {"text": str | [str]}
    GET  /get_model_info  -> {"model_path", "tokenizer_path", "is_generation", "preferred_sampling_params", "weight_version"}
    GET  /version         -> {"version"}
"""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from minisgl.version import __version__
from minisgl.server.admission import check_text
from minisgl.server.errors import ApiError
from minisgl.server.json_numbers import JsonNumbersRoute
from minisgl.server.openai_types import STRICT, ChatMessage, ChatTemplateKwargs, TokenIds
from minisgl.server.serving import ServingContext
from minisgl.tokenizer.chat import render_chat

WEIGHT_VERSION = "default"  # SGLang's value for weights that were never updated in place


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(STRICT, extra="forbid")

    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = True
    chat_template_kwargs: ChatTemplateKwargs | None = None

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        if self.chat_template_kwargs is not None and self.messages is None:
            raise ValueError("chat_template_kwargs needs messages")
        return self


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[list[int]]
    count: int | list[int]
    max_model_len: int


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(STRICT, extra="forbid")

    model: str | None = None
    tokens: TokenIds | Annotated[list[TokenIds], Field(min_length=1)]
    skip_special_tokens: bool = True


class DetokenizeResponse(BaseModel):
    text: str | list[str]


class ModelInfo(BaseModel):
    model_path: str
    tokenizer_path: str
    is_generation: bool
    preferred_sampling_params: dict[str, Any] | None
    weight_version: str


class Version(BaseModel):
    version: str


router = APIRouter(route_class=JsonNumbersRoute)  # JSON numbers read as the OpenAI routes read them


def _ctx(raw: Request, model: str | None) -> ServingContext:
    ctx: ServingContext = raw.app.state.ctx
    if model is not None and model != ctx.model_name:
        raise ApiError(404, f"The model `{model}` does not exist; this server serves `{ctx.model_name}`.", "model")
    return ctx


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, raw: Request) -> TokenizeResponse:
    ctx = _ctx(raw, body.model)
    check_text(body)  # strings the tokenizer cannot take are a 400 naming the field
    if body.messages is not None:
        try:
            text = render_chat(ctx.tokenizer, [m.model_dump(exclude_none=True) for m in body.messages], None,
                               body.chat_template_kwargs)
        except ValueError as e:
            raise ApiError(400, str(e), "messages") from None
        texts, specials = [text], False  # the template wrote the special tokens
    else:
        texts, specials = [body.prompt] if isinstance(body.prompt, str) else body.prompt, body.add_special_tokens
    ids = [ctx.tokenizer.encode(t, add_special_tokens=specials) for t in texts]
    one = not isinstance(body.prompt, list)
    return TokenizeResponse(tokens=ids[0] if one else ids, count=len(ids[0]) if one else [len(x) for x in ids],
                            max_model_len=ctx.info.max_seq_len)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, raw: Request) -> DetokenizeResponse:
    ctx = _ctx(raw, body.model)
    one = not isinstance(body.tokens[0], list)
    batch = [body.tokens] if one else body.tokens
    vocab = ctx.info.vocab_size
    for seq in batch:
        bad = [t for t in seq if t >= vocab]
        if bad:
            raise ApiError(400, f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", "tokens")
    texts = [ctx.tokenizer.decode(seq, skip_special_tokens=body.skip_special_tokens) for seq in batch]
    return DetokenizeResponse(text=texts[0] if one else texts)


@router.get("/get_model_info")
async def get_model_info(raw: Request) -> ModelInfo:
    ctx = _ctx(raw, None)
    path = ctx.info.model_path
    return ModelInfo(model_path=path, tokenizer_path=path, is_generation=True,
                     preferred_sampling_params=dict(ctx.defaults.values) or None, weight_version=WEIGHT_VERSION)


@router.get("/version")
async def version() -> Version:
    return Version(version=__version__)
