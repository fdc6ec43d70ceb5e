"""POST /v1/chat/completions: messages (and tools) through the model's chat template with the
request's chat_template_kwargs, n, logprobs / top_logprobs, vLLM's prompt_logprobs, and, with
--reasoning-parser / --tool-call-parser, reasoning_content and tool_calls in the answer."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from minisgl.scheduler.messages import FINISH_STOP, RequestOutput
from minisgl.server.chat_stream import ChoiceStream
from minisgl.server.openai_types import ChatCompletionRequest
from minisgl.server.reasoning import REASONING_PARSERS, prompt_opens_thinking
from minisgl.server.sampling import requested_max_tokens
from minisgl.server.errors import ApiError
from minisgl.server.serving import Choice, ServingContext, created, new_id, respond, usage
from minisgl.server.tool_choice import plan_tools
from minisgl.tokenizer.chat import render_chat, unused_template_kwargs

logger = logging.getLogger(__name__)
FINISH_TOOL_CALLS = "tool_calls"


@dataclass
class _State:
    choice: Choice
    stream: ChoiceStream
    started: bool = False
    completion_tokens: int = 0
    cached_tokens: int = 0


def _template_kwargs(ctx: ServingContext, body: ChatCompletionRequest) -> dict[str, Any]:
    kwargs = dict(body.chat_template_kwargs or {})
    unused = unused_template_kwargs(ctx.tokenizer, kwargs)
    if unused:
        logger.warning("chat_template_kwargs this model's template does not read: %s", ", ".join(unused))
    return kwargs


async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    ctx: ServingContext = raw.app.state.ctx
    ctx.check_request(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, ctx.tool_call_parser)
    try:
        text = render_chat(ctx.tokenizer, [m.model_dump(exclude_none=True) for m in body.messages], tools.tools,
                           _template_kwargs(ctx, body))
    except ValueError as e:
        raise ApiError(400, str(e), "messages") from None
    text = tools.prompt(text)
    ids = ctx.tokenizer.encode(text, add_special_tokens=False)  # the template wrote the specials
    ctx.check_prompt(ids)
    max_tokens = ctx.max_tokens(len(ids), requested_max_tokens(body, ctx.defaults))
    if max_tokens == 0:
        raise ApiError(400, "max_tokens must be at least 1 for chat completions", "max_tokens")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    reasoning = REASONING_PARSERS.get(ctx.reasoning_parser)
    thinking = prompt_opens_thinking(text)
    cid, ts = new_id("chatcmpl"), created()
    states: dict[str, _State] = {}
    for j in range(body.n):
        params = ctx.sampling_params(body, max_tokens, logprobs, body.prompt_logprobs, j)
        c = Choice(j, f"{cid}-{j}", tuple(ids), params, chat_turn=True)
        states[c.rid] = _State(c, ChoiceStream(reasoning(thinking) if reasoning else None, tools.new_parser()))

    def delta(o: RequestOutput) -> dict[str, Any]:
        st = states[o.rid]
        first, st.started = not st.started, True
        st.completion_tokens, st.cached_tokens = o.num_output_tokens, o.num_cached_tokens
        message = st.stream.push(o.text, o.finished)
        finish = o.finish_reason
        if finish == FINISH_STOP and st.stream.called_tools:
            finish = FINISH_TOOL_CALLS
        return {
            "index": st.choice.index,
            "delta": {"role": "assistant", **message} if first else message,
            "logprobs": {"content": ctx.formatter.chat(o.logprobs)} if body.logprobs else None,
            "finish_reason": finish,
            "stop_reason": o.matched_stop,
            **ctx.extensions(body, st.choice, o, first),
        }

    def total_usage() -> dict[str, Any]:  # the n choices share one prompt: its tokens count once
        return usage(len(ids), sum(s.completion_tokens for s in states.values()),
                     max(s.cached_tokens for s in states.values()))

    head = {"id": cid, "object": "chat.completion", "created": ts, "model": ctx.model_name}
    choices = [s.choice for s in states.values()]
    return await respond(ctx, raw, body, choices, head, "chat.completion.chunk", delta, total_usage, _as_message)


def _as_message(choice: dict[str, Any]) -> dict[str, Any]:
    """A merged stream choice -> a non-streaming one: the accumulated delta is the message, its
    content null when the answer is only reasoning or tool calls, and tool calls without the
    stream's index."""
    out = {k: v for k, v in choice.items() if k != "delta"}
    message = {"role": "assistant", **choice.get("delta", {})}
    if "tool_calls" in message:
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in message["tool_calls"]]
    only_other = "tool_calls" in message or "reasoning_content" in message
    message.setdefault("content", None if only_other else "")
    out["message"] = message
    return out
