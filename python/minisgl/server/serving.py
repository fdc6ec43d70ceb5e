"""What the completions and chat endpoints share: request validation against the model's limits,
fanning a request out into one engine request per choice, and delivering the choices' outputs
as SSE chunks or one merged JSON body, aborting whatever is left when the client goes away."""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask
from transformers import PreTrainedTokenizerBase

from minisgl.sampling_defaults import SamplingDefaults
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest, RequestOutput, SchedulerInfo
from minisgl.scheduler.prompt_check import prompt_error
from minisgl.server.admission import Admission, check_text, response_id
from minisgl.server.engine_client import EngineClient, EngineUnavailable, Submission
from minisgl.server.errors import ApiError, error_body
from minisgl.server.logprob_format import LogprobFormatter
from minisgl.server.metrics import RequestTimer, ServerMetrics
from minisgl.server.openai_types import SamplingFields
from minisgl.server.request_log import RequestLog
from minisgl.server.sampling import request_sampling_params
from minisgl.tokenizer.chat import generation_prompts, opens_assistant_turn
from minisgl.tokenizer.token_text import TokenTexts


logger = logging.getLogger(__name__)
CLIENT_CLOSED_REQUEST = 499  # (nginx's code) logged for a non-streaming request whose client left


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # json.dumps builds one per call otherwise


def sse(obj: Any) -> str:
    return f"data: {_JSON.encode(obj)}\n\n"


class ChunkEvents:
    """SSE events of one response's chunks: the head's fields, then `choices` holding one choice.
    The head is encoded once, so each event encodes only its choice; the bytes are sse()'s of the
    whole chunk."""

    def __init__(self, head: dict[str, Any]) -> None:
        if not head:
            raise ValueError("a chunk head needs at least one field")
        self._prefix = "data: " + _JSON.encode(head)[:-1] + ',"choices":['

    def __call__(self, choice: dict[str, Any]) -> str:
        return self._prefix + _JSON.encode(choice) + "]}\n\n"


@dataclass(frozen=True)
class Choice:
    """One OpenAI choice, run as one engine request."""

    index: int
    rid: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    chat_turn: bool = False  # GenerateRequest.chat_turn


class ServingContext:
    def __init__(
        self,
        client: EngineClient,
        tokenizer: PreTrainedTokenizerBase,
        model_name: str,
        metrics: ServerMetrics,
        admission: Admission,
        defaults: SamplingDefaults = SamplingDefaults(),
        reasoning_parser: str | None = None,
        tool_call_parser: str | None = None,
        request_log: RequestLog | None = None,
    ) -> None:
        self.client = client
        self.admission = admission
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.metrics = metrics
        self.defaults = defaults  # the checkpoint's generation_config sampling defaults
        self.reasoning_parser, self.tool_call_parser = reasoning_parser, tool_call_parser
        self.request_log = request_log or RequestLog(enabled=False)
        self.formatter = LogprobFormatter(TokenTexts(tokenizer))
        self.generation_prompts = generation_prompts(tokenizer)

    @property
    def info(self) -> SchedulerInfo:
        try:
            self.client.check_alive()
        except EngineUnavailable as e:
            raise ApiError(503, str(e)) from None
        assert self.client.info is not None
        return self.client.info

    def check_request(self, body: SamplingFields) -> None:
        if body.model is not None and body.model != self.model_name:
            raise ApiError(404, f"The model `{body.model}` does not exist; this server serves `{self.model_name}`.",
                           "model")
        bad = body.unsupported()
        if bad:
            raise ApiError(400, f"not supported by this server: {', '.join(bad)}", bad[0])
        check_text(body)
        self.warn_unknown(body)

    @staticmethod
    def warn_unknown(body: BaseModel) -> None:
        if body.model_extra:
            logger.warning("ignoring request fields this server does not know: %s", ", ".join(sorted(body.model_extra)))

    def check_prompt(self, ids: list[int]) -> None:
        if (error := prompt_error(ids, self.info.max_seq_len, self.info.vocab_size)) is not None:
            raise ApiError(400, error, "prompt")

    def max_tokens(self, prompt_len: int, requested: int | None) -> int:
        """requested, or all the room left when None; more than the room left is an error (as vLLM)."""
        room = self.info.max_seq_len - prompt_len
        if requested is None:
            return room
        if requested > room:
            raise ApiError(400, f"This model's maximum context length is {self.info.max_seq_len} tokens. However, "
                                f"you requested {prompt_len + requested} tokens ({prompt_len} in the prompt, "
                                f"{requested} for the completion). Reduce the prompt or max_tokens.", "max_tokens")
        return requested

    def sampling_params(
        self, body: SamplingFields, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None, j: int
    ) -> SamplingParams:
        try:
            return request_sampling_params(
                body, self.defaults, self.info.vocab_size, max_tokens, logprobs, prompt_logprobs, j
            )
        except ValueError as e:
            raise ApiError(400, str(e)) from None


    def extensions(self, body: SamplingFields, choice: Choice, o: RequestOutput, first: bool) -> dict[str, Any]:
        """vLLM's extra choice fields, when asked for: prompt_logprobs, prompt_token_ids, token_ids."""
        out: dict[str, Any] = {}
        if body.prompt_logprobs is not None and o.prompt_logprobs is not None:
            out["prompt_logprobs"] = self.formatter.prompt(o.prompt_logprobs)
        if body.return_token_ids:
            out["token_ids"] = list(o.new_token_ids)
            if first:
                out["prompt_token_ids"] = list(choice.prompt_ids)
        return out


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


Outputs = AsyncIterator[list[RequestOutput]]  # in arrival order, as the lists that were queued together


async def run_choices(ctx: ServingContext, sub: Submission, close: Callable[[], None]) -> Outputs:
    """Outputs of every choice as they come. Closing the iterator early aborts the rest."""
    timer = RequestTimer(ctx.metrics)
    try:
        async for batch in sub.batches():
            for i, o in enumerate(batch):
                timer.on_output(o)
                ctx.request_log.on_output(o)
                if o.error is not None:
                    if i:
                        yield batch[:i]  # the outputs before it are answered first, as they came
                    raise ApiError(400, o.error)
            yield batch
    except EngineUnavailable as e:
        raise ApiError(503, str(e)) from None
    finally:
        close()


async def _until_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


ChunkFn = Callable[[RequestOutput], dict[str, Any]]


def sse_response(
    outputs: Outputs,
    close: Callable[[], None],
    event: Callable[[RequestOutput], str],
    usage_chunk: Callable[[], dict[str, Any]] | None,
) -> StreamingResponse:
    """SSE: one chunk event per output, an optional usage chunk, then [DONE]. The events of outputs
    that arrived together (a handler that fell behind, or several choices) go out in one write: a
    write and its trip through the ASGI layers cost more than formatting a chunk. Only the engine
    failing can still go wrong once the headers went out: that is sent as an `error` event (the
    openai client raises it)."""

    async def events() -> AsyncIterator[str]:
        try:
            async with aclosing(outputs):
                async for batch in outputs:
                    yield "".join([event(o) for o in batch])
            if usage_chunk is not None:
                yield sse(usage_chunk())
        except ApiError as e:
            yield sse(error_body(e.status, e.message, e.param))
        yield "data: [DONE]\n\n"

    async def close_after() -> None:  # async: a sync background task would run in a thread, off the event loop
        close()

    # Starlette cancels `events` when the client disconnects, and aclosing then aborts the choices;
    # the background close covers a client gone before `events` ever started.
    return StreamingResponse(events(), media_type="text/event-stream", background=BackgroundTask(close_after))


async def collect_outputs(raw: Request, outputs: Outputs, on_output: Callable[[RequestOutput], None]) -> bool:
    """Feed every output to on_output; True if the client disconnected first (the rest is aborted)."""

    async def consume() -> None:
        async with aclosing(outputs):
            async for batch in outputs:
                for o in batch:
                    on_output(o)

    work = asyncio.ensure_future(consume())
    gone = asyncio.ensure_future(_until_disconnect(raw))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (work, gone):
            if not t.done():
                t.cancel()
        await asyncio.gather(work, gone, return_exceptions=True)
    if work.cancelled():
        return True
    work.result()  # re-raise ApiError
    return False


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens: prompt tokens the prefix cache served."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def created() -> int:
    return int(time.time())


def merge_delta(into: dict[str, Any], delta: dict[str, Any]) -> None:
    """Fold a streamed choice delta into the running choice: strings concatenate, lists extend,
    dicts merge, None never overwrites. Non-streaming responses are the merge of the stream."""
    for k, v in delta.items():
        cur = into.get(k)
        if v is None:
            into.setdefault(k, None)
        elif isinstance(v, str) and isinstance(cur, str):
            into[k] = cur + v
        elif isinstance(v, dict) and isinstance(cur, dict):
            merge_delta(cur, v)
        elif isinstance(v, list) and isinstance(cur, list):
            cur.extend(v)
        else:
            into[k] = v


def start_choices(ctx: ServingContext, request_id: str, choices: list[Choice]) -> tuple[Outputs, Callable[[], None]]:
    """Admit the choices as one response's engine requests (every check happens here, before any
    header is sent): their outputs, and the close that ends the response (idempotent: whichever
    way the response ends first closes the submission, aborting what still runs)."""
    # A prompt the client rendered with the chat template is a chat turn too (its next turn's prefix).
    reqs = [GenerateRequest(c.rid, c.prompt_ids, c.params,
                            c.chat_turn or opens_assistant_turn(c.prompt_ids, ctx.generation_prompts))
            for c in choices]
    sub = ctx.admission.admit(request_id, reqs)
    ctx.request_log.received(request_id, reqs)

    def close() -> None:
        ctx.metrics.count_aborts(sub.close())
        ctx.request_log.forget(sub.rids)

    return run_choices(ctx, sub, close), close


async def respond(
    ctx: ServingContext,
    raw: Request,
    body: SamplingFields,
    choices: list[Choice],
    head: dict[str, Any],
    chunk_object: str,
    delta: ChunkFn,
    total_usage: Callable[[], dict[str, Any]],
    finish: Callable[[dict[str, Any]], dict[str, Any]] = lambda c: c,
) -> Response:
    """Admit the choices (every check happens here, before any header is sent), then stream their
    deltas, or merge them into one body whose choices pass through finish()."""
    head = {**head, "id": response_id(raw, head["id"])}
    outputs, close = start_choices(ctx, head["id"], choices)
    if body.stream:
        chunk_head = {**head, "object": chunk_object}
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunk_event = ChunkEvents(chunk_head)
        return sse_response(
            outputs, close, lambda o: chunk_event(delta(o)),
            (lambda: {**chunk_head, "choices": [], "usage": total_usage()}) if include_usage else None,
        )
    index = {c.rid: c.index for c in choices}
    merged: dict[int, dict[str, Any]] = {c.index: {} for c in choices}
    try:
        gone = await collect_outputs(raw, outputs, lambda o: merge_delta(merged[index[o.rid]], delta(o)))
    finally:
        close()  # also when the client left before the outputs were ever read
    if gone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody is left to read a body
    return JSONResponse({**head, "choices": [finish(merged[i]) for i in sorted(merged)], "usage": total_usage()})
