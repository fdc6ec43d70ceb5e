"""POST /v1/completions: prompts as text or token ids (one or a batch), n, echo, logprobs, and
vLLM's prompt_logprobs; max_tokens 0 scores the prompt without generating."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from minisgl.scheduler.messages import FINISH_LENGTH, RequestOutput
from minisgl.server.openai_types import MAX_CHOICES, CompletionRequest
from minisgl.server.sampling import requested_max_tokens
from minisgl.server.serving import (
    ApiError,
    Choice,
    ServingContext,
    created,
    new_id,
    respond,
    usage,
)


@dataclass
class _State:
    choice: Choice
    prompt_text: str
    started: bool = False
    offset: int = 0  # text_offset of the next logprob token
    completion_tokens: int = 0
    cached_tokens: int = 0


def _prompts(ctx: ServingContext, prompt: Any, echo: bool) -> list[tuple[str, list[int]]]:
    """(text, token ids) per prompt. The text of a prompt of ids is only needed to echo it (decoding
    a long prompt costs more than streaming its answer), so without echo it is left empty."""
    tok = ctx.tokenizer
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise ApiError(400, "the prompt is empty", "prompt")
    if isinstance(prompt[0], int):
        prompt = [prompt]
    ids = [tok.encode(p) if isinstance(p, str) else list(p) for p in prompt]
    for one in ids:
        ctx.check_prompt(one)  # before decoding: ids outside the vocabulary would crash the tokenizer
    return [(p if isinstance(p, str) else tok.decode(one) if echo else "", one) for p, one in zip(prompt, ids)]


async def create_completion(body: CompletionRequest, raw: Request) -> Response:
    ctx: ServingContext = raw.app.state.ctx
    ctx.check_request(body)
    prompts = _prompts(ctx, body.prompt, body.echo)
    if len(prompts) * body.n > MAX_CHOICES:
        raise ApiError(400, f"{len(prompts)} prompts x n={body.n} exceeds {MAX_CHOICES} choices per request", "n")
    echo_logprobs = body.echo and body.logprobs is not None
    prompt_logprobs = body.prompt_logprobs
    if echo_logprobs:  # echo with logprobs scores the prompt tokens too
        prompt_logprobs = max(prompt_logprobs or 0, body.logprobs)
    cid, ts = new_id("cmpl"), created()
    prompt_tokens = sum(len(ids) for _, ids in prompts)
    if body.max_tokens == 0 and prompt_logprobs is None:  # nothing to compute
        choices = [{"index": i * body.n + j, "text": text if body.echo else "", "logprobs": None,
                    "finish_reason": FINISH_LENGTH} for i, (text, _) in enumerate(prompts) for j in range(body.n)]
        return JSONResponse({"id": cid, "object": "text_completion", "created": ts, "model": ctx.model_name,
                             "choices": choices, "usage": usage(prompt_tokens, 0)})
    states: dict[str, _State] = {}
    for i, (text, ids) in enumerate(prompts):
        max_tokens = ctx.max_tokens(len(ids), requested_max_tokens(body, ctx.defaults))
        for j in range(body.n):
            index = i * body.n + j
            params = ctx.sampling_params(body, max_tokens, body.logprobs, prompt_logprobs, j)
            c = Choice(index, f"{cid}-{index}", tuple(ids), params)
            states[c.rid] = _State(c, text)
    choices = [s.choice for s in states.values()]

    def delta(o: RequestOutput) -> dict[str, Any]:
        st = states[o.rid]
        first, st.started = not st.started, True
        text = o.text
        entries = [(e.token_id, e) for e in o.logprobs]
        if body.echo and first:
            text = st.prompt_text + text
            if echo_logprobs and o.prompt_logprobs is not None:
                entries = list(zip(st.choice.prompt_ids, o.prompt_logprobs)) + entries
        d: dict[str, Any] = {"index": st.choice.index, "text": text, "logprobs": None,
                             "finish_reason": o.finish_reason, "stop_reason": o.matched_stop}
        if body.logprobs is not None:
            d["logprobs"] = ctx.formatter.completion(entries, st.offset)
            st.offset += sum(len(t) for t in d["logprobs"]["tokens"])
        st.completion_tokens, st.cached_tokens = o.num_output_tokens, o.num_cached_tokens
        return {**d, **ctx.extensions(body, st.choice, o, first)}

    def total_usage() -> dict[str, Any]:  # each prompt's tokens count once, as its n choices share them
        cached = [max(s.cached_tokens for s in states.values() if s.choice.index // body.n == i)
                  for i in range(len(prompts))]
        return usage(prompt_tokens, sum(s.completion_tokens for s in states.values()), sum(cached))

    head = {"id": cid, "object": "text_completion", "created": ts, "model": ctx.model_name}
    return await respond(ctx, raw, body, choices, head, "text_completion", delta, total_usage)
