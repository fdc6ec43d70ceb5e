"""POST /v1/chat/completions: messages through the model's chat template, n, logprobs /
top_logprobs, and vLLM's prompt_logprobs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from minisgl.scheduler.io import RequestOutput
from minisgl.server.openai_types import ChatCompletionRequest
from minisgl.server.serving import ApiError, Choice, ServingContext, created, new_id, respond, usage
from minisgl.tokenizer.chat import render_chat


@dataclass
class _State:
    choice: Choice
    started: bool = False
    completion_tokens: int = 0


async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    ctx: ServingContext = raw.app.state.ctx
    ctx.check_request(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    try:
        text = render_chat(ctx.tokenizer, [m.model_dump(exclude_none=True) for m in body.messages])
    except ValueError as e:
        raise ApiError(400, str(e), "messages") from None
    ids = ctx.tokenizer.encode(text, add_special_tokens=False)  # the template wrote the specials
    ctx.check_prompt(ids)
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    max_tokens = ctx.max_tokens(len(ids), requested)
    if max_tokens == 0:
        raise ApiError(400, "max_tokens must be at least 1 for chat completions", "max_tokens")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    cid, ts = new_id("chatcmpl"), created()
    states: dict[str, _State] = {}
    for j in range(body.n):
        params = ctx.sampling_params(body, max_tokens, logprobs, body.prompt_logprobs, j)
        c = Choice(j, f"{cid}-{j}", tuple(ids), params)
        states[c.rid] = _State(c)

    def delta(o: RequestOutput) -> dict[str, Any]:
        st = states[o.rid]
        first, st.started = not st.started, True
        st.completion_tokens = o.num_output_tokens
        return {
            "index": st.choice.index,
            "delta": {"role": "assistant", "content": o.text} if first else {"content": o.text},
            "logprobs": {"content": ctx.formatter.chat(o.logprobs)} if body.logprobs else None,
            "finish_reason": o.finish_reason,
            "stop_reason": o.matched_stop,
            **ctx.extensions(body, st.choice, o, first),
        }

    def total_usage() -> dict[str, int]:
        return usage(len(ids), sum(s.completion_tokens for s in states.values()))

    head = {"id": cid, "object": "chat.completion", "created": ts, "model": ctx.model_name}
    choices = [s.choice for s in states.values()]
    return await respond(ctx, raw, body, choices, head, "chat.completion.chunk", delta, total_usage, _as_message)


def _as_message(choice: dict[str, Any]) -> dict[str, Any]:
    """A merged stream choice -> a non-streaming one: the accumulated delta is the message."""
    out = {k: v for k, v in choice.items() if k != "delta"}
    out["message"] = choice["delta"]
    return out
