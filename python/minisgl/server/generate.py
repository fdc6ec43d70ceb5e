"""SGLang's native POST /generate: `text` or `input_ids` (one prompt or a batch), `sampling_params`
(one for all, or one per prompt; `n` samples each), `stream`, `return_logprob` with
`top_logprobs_num` and `logprob_start_len`, `return_text_in_logprobs`.

A result is {"text", "output_ids", "meta_info"}; meta_info holds the request id, finish_reason
({"type": "length", "length": N}, {"type": "stop", "matched": token id or string}, or
{"type": "abort", "message"}), prompt_tokens, completion_tokens, cached_tokens, e2e_latency and,
when asked for, output_token_logprobs / output_top_logprobs / input_token_logprobs /
input_top_logprobs as [logprob, token id, text or null] entries. One prompt with n = 1 answers one
result, anything more a list in prompt-then-sample order. Streaming sends the result so far as
each output arrives (text, ids and logprobs cumulative, as SGLang's default), with "index" when
there are several, then `data: [DONE]`."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from minisgl.scheduler.messages import FINISH_ABORT, FINISH_LENGTH, RequestOutput, TokenLogprob
from minisgl.server.admission import check_text, response_id
from minisgl.server.generate_types import DEFAULT_MAX_NEW_TOKENS, GenerateRequestBody, GenerateSampling
from minisgl.server.openai_types import MAX_CHOICES
from minisgl.server.serving import (
    CLIENT_CLOSED_REQUEST,
    ApiError,
    Choice,
    ServingContext,
    collect_outputs,
    new_id,
    sse,
    sse_response,
    start_choices,
)


@dataclass
class _Result:
    """One sample's result as it grows."""

    choice: Choice
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[list[Any]] = field(default_factory=list)
    output_tops: list[list[list[Any]]] = field(default_factory=list)
    input_logprobs: list[list[Any]] | None = None
    input_tops: list[list[list[Any]] | None] | None = None
    finish: dict[str, Any] | None = None
    cached_tokens: int = 0


class _Render:
    """RequestOutputs -> the results, in SGLang's shapes."""

    def __init__(self, ctx: ServingContext, body: GenerateRequestBody, choices: list[Choice]) -> None:
        self.ctx, self.body, self.start = ctx, body, time.perf_counter()
        self.results = {c.rid: _Result(c) for c in choices}
        self.several = len(choices) > 1

    def _entry(self, logprob: float | None, token_id: int) -> list[Any]:
        text = self.ctx.formatter.texts.get(token_id)[0] if self.body.return_text_in_logprobs else None
        return [logprob, token_id, text]

    def _tops(self, e: TokenLogprob) -> list[list[Any]]:
        return [self._entry(lp, t) for t, lp in e.top]

    def push(self, o: RequestOutput) -> _Result:
        r = self.results[o.rid]
        r.text += o.text
        r.output_ids.extend(o.new_token_ids)
        r.cached_tokens = o.num_cached_tokens
        for e in o.logprobs:
            r.output_logprobs.append(self._entry(e.logprob, e.token_id))
            r.output_tops.append(self._tops(e))
        if o.prompt_logprobs is not None:
            start = self.body.logprob_start_len
            pairs = list(zip(r.choice.prompt_ids, o.prompt_logprobs))[start:]
            r.input_logprobs = [self._entry(None if e is None else e.logprob, t) for t, e in pairs]
            r.input_tops = [None if e is None else self._tops(e) for _, e in pairs]
        if o.finish_reason is not None:
            r.finish = _finish(o)
        return r

    def result(self, r: _Result) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": r.choice.rid,
            "finish_reason": r.finish,
            "prompt_tokens": len(r.choice.prompt_ids),
            "completion_tokens": len(r.output_ids),
            "cached_tokens": r.cached_tokens,
            "e2e_latency": time.perf_counter() - self.start,
        }
        if self.body.return_logprob:
            meta["output_token_logprobs"] = r.output_logprobs
            meta["output_top_logprobs"] = r.output_tops
            if r.input_logprobs is not None:
                meta["input_token_logprobs"] = r.input_logprobs
                meta["input_top_logprobs"] = r.input_tops
        out = {"text": r.text, "output_ids": r.output_ids, "meta_info": meta}
        return {**out, "index": r.choice.index} if self.several else out


def _finish(o: RequestOutput) -> dict[str, Any]:
    if o.finish_reason == FINISH_LENGTH:
        return {"type": "length", "length": o.num_output_tokens}
    if o.finish_reason == FINISH_ABORT:
        return {"type": "abort", "message": o.error or "aborted"}
    return {"type": "stop", "matched": o.matched_stop}


def _prompts(ctx: ServingContext, body: GenerateRequestBody) -> list[list[int]]:
    if (body.text is None) == (body.input_ids is None):
        raise ApiError(400, "give exactly one of text and input_ids", "text")
    if body.text is not None:
        texts = [body.text] if isinstance(body.text, str) else body.text
        ids = [ctx.tokenizer.encode(t) for t in texts]
    else:
        ids = [list(body.input_ids)] if isinstance(body.input_ids[0], int) else [list(p) for p in body.input_ids]
    for one in ids:
        ctx.check_prompt(one)
    return ids


def _sampling(body: GenerateRequestBody, prompts: int) -> list[GenerateSampling]:
    given = body.sampling_params if body.sampling_params is not None else GenerateSampling()
    if not isinstance(given, list):
        return [given] * prompts
    if len(given) != prompts:
        raise ApiError(400, f"sampling_params has {len(given)} entries for {prompts} prompts", "sampling_params")
    return given


def _max_new_tokens(ctx: ServingContext, s: GenerateSampling, prompt_len: int) -> int:
    """max_new_tokens as set, else the generation_config's, else SGLang's 128, within the room left
    (a set value beyond it is an error, as on the OpenAI routes)."""
    room = ctx.info.max_seq_len - prompt_len
    if "max_new_tokens" in s.model_fields_set and s.max_new_tokens is not None:
        if s.max_new_tokens > room:
            raise ApiError(400, f"This model's maximum context length is {ctx.info.max_seq_len} tokens; the prompt "
                                f"has {prompt_len} and max_new_tokens asks for {s.max_new_tokens} more.",
                           "sampling_params.max_new_tokens")
        return s.max_new_tokens
    return min(ctx.defaults.get("max_tokens", DEFAULT_MAX_NEW_TOKENS), room)


def _choices(ctx: ServingContext, body: GenerateRequestBody, rid: str) -> list[Choice]:
    prompts = _prompts(ctx, body)
    sampling = _sampling(body, len(prompts))
    for s in sampling:
        if bad := s.unsupported():
            raise ApiError(400, f"not supported by this server: {', '.join(bad)}", f"sampling_params.{bad[0]}")
    n = sampling[0].n
    if any(s.n != n for s in sampling):
        raise ApiError(400, "every prompt's sampling_params must ask for the same n", "sampling_params.n")
    if len(prompts) * n > MAX_CHOICES:
        raise ApiError(400, f"{len(prompts)} prompts x n={n} exceeds {MAX_CHOICES} results per request",
                       "sampling_params.n")
    logprobs = body.top_logprobs_num if body.return_logprob else None
    prompt_logprobs = logprobs if body.return_logprob and body.logprob_start_len >= 0 else None
    choices = []
    for i, (ids, s) in enumerate(zip(prompts, sampling)):
        max_tokens = _max_new_tokens(ctx, s, len(ids))
        if max_tokens == 0 and prompt_logprobs is None:
            raise ApiError(400, "max_new_tokens 0 only scores a prompt: it needs return_logprob with "
                                "logprob_start_len >= 0", "sampling_params.max_new_tokens")
        for j in range(n):
            params = ctx.sampling_params(s.as_openai(), max_tokens, logprobs, prompt_logprobs, j)
            choices.append(Choice(i * n + j, f"{rid}-{i * n + j}", tuple(ids), params))
    return choices


async def create_generate(body: GenerateRequestBody, raw: Request) -> Response:
    ctx: ServingContext = raw.app.state.ctx
    if bad := body.unsupported():
        raise ApiError(400, f"not supported by this server: {', '.join(bad)}", bad[0])
    check_text(body)
    ctx.warn_unknown(body)
    rid = response_id(raw, body.rid or new_id("gen"))
    choices = _choices(ctx, body, rid)
    render = _Render(ctx, body, choices)
    outputs, close = start_choices(ctx, rid, choices)
    if body.stream:
        return sse_response(outputs, close, lambda o: sse(render.result(render.push(o))), None)
    try:
        gone = await collect_outputs(raw, outputs, render.push)
    finally:
        close()
    if gone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return _answer(render, [render.result(r) for r in render.results.values()])


def _answer(render: _Render, results: list[dict[str, Any]]) -> JSONResponse:
    return JSONResponse(results if render.several else results[0])
