"""The FastAPI app: OpenAI-compatible routes, SGLang's native ones (server/native_routes.py), health,
metrics, abort and server info. Every error
is an OpenAI-shaped body with a message: 400 for bad input (naming the field), 401 without the API
key, 404 for an unknown model or route, 405 (with Allow) for a wrong method, 408/413 for a body too
slow or too large, 503 (with the reason) once the engine is gone or while the server is full."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from minisgl.version import __version__
from minisgl.server import native_routes
from minisgl.server.args import ServerArgs
from minisgl.server.auth import ApiKeyAuth
from minisgl.server.chat import create_chat_completion
from minisgl.server.completions import create_completion
from minisgl.server.engine_client import EngineUnavailable
from minisgl.server.errors import ApiError, ErrorResponse, error_response
from minisgl.server.generate import create_generate
from minisgl.server.heap import settle_for_serving
from minisgl.server.json_numbers import JsonNumbersRoute
from minisgl.server.limits import BodyLimits
from minisgl.server.openai_types import AbortBody
from minisgl.server.serving import ServingContext, created

logger = logging.getLogger(__name__)

_ERRORS = {
    400: "Bad request: the message says what was wrong and `param` names the field",
    401: "The server has an --api-key and the request did not carry it (`Authorization: Bearer <key>`)",
    404: "Unknown model",
    408: "The request body did not arrive within --body-read-timeout",
    413: "The request body is larger than --max-request-body-bytes",
    503: "The engine is unavailable, or the server is at capacity (then with Retry-After): the message says why",
}


def _responses(*codes: int, **extra: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {c: {"description": _ERRORS[c], "model": ErrorResponse} for c in codes}
    return {**out, **{int(k): v for k, v in extra.items()}}


_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "string", "description": "a JSON chunk, or [DONE] at the end"}}}
_STREAM = {"description": "The completion; with `stream: true`, server-sent events ending in `data: [DONE]`",
           "content": {"text/event-stream": {"schema": _SSE_EVENT}}}


class Health(BaseModel):
    status: Literal["ok"] = "ok"


def _loc(loc: tuple[Any, ...]) -> str:
    """("body", "prompt", "list[constrained-int]", 3) -> "prompt[3]": pydantic's union-member tags dropped."""
    out = ""
    for x in loc:
        if isinstance(x, int):
            out += f"[{x}]"
        elif x != "body" and x.isidentifier() and x not in _TYPE_TAGS:
            out += f".{x}" if out else x
    return out or "body"


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict"})


def _validation_message(e: RequestValidationError) -> tuple[str, str | None]:
    """The message and the field. Within a union pydantic reports a mismatch for every member; the
    member whose shape matched says what is actually wrong, so a field's type mismatches are shown
    only when it has nothing more specific."""
    by_field: dict[str, list[dict[str, Any]]] = {}
    for err in e.errors():
        if err.get("type") == "json_invalid":
            return f"malformed JSON: {err.get('ctx', {}).get('error', err.get('msg'))}", None
        by_field.setdefault(_loc(err.get("loc", ()))
                            .replace("[", ".").split(".")[0], []).append(err)
    parts: list[str] = []
    for errs in by_field.values():
        specific = [x for x in errs if not str(x.get("type", "")).endswith("_type")] or errs
        parts += [f"{_loc(x.get('loc', ()))}: {x.get('msg')}" for x in specific]
    fields = [f for f in by_field if f != "body"]
    return "; ".join(list(dict.fromkeys(parts))[:5]), fields[0] if fields else None


def build_app(make_context: Callable[[], ServingContext], args: ServerArgs) -> FastAPI:
    """make_context runs inside the event loop, at start-up; start-up waits for the engine."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = make_context()
        app.state.ctx = ctx
        info = await ctx.client.start(args.startup_timeout)
        settle_for_serving()
        logger.info(
            "ready on http://%s:%d: serving %s (%s); %d KV pages of %d tokens, %d request/state slots, max_seq_len %d; engine ready "
            "in %.1f s, warm-up %.1f s with %d Triton compiles/autotunes",
            args.host, args.port, ctx.model_name, info.device, info.total_pages, info.page_size, info.max_running_requests, info.max_seq_len,
            info.startup_seconds, info.warmup_seconds, info.warmup_compiles,
        )
        try:
            yield
        finally:
            await ctx.client.stop()

    app = FastAPI(title="minisgl", version=__version__, lifespan=lifespan)
    app.router.route_class = JsonNumbersRoute  # before any route is added
    app.add_middleware(BodyLimits, max_bytes=args.max_request_body_bytes, timeout_s=args.body_read_timeout)
    if args.api_key is not None:
        app.add_middleware(ApiKeyAuth, api_key=args.api_key)  # added last: runs first, before any body is read

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return error_response(e.status, e.message, e.param, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(400, *_validation_message(e))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, e: HTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail), headers=e.headers)  # e.g. a 405's Allow

    @app.exception_handler(EngineUnavailable)
    async def _unavailable(_: Request, e: EngineUnavailable) -> JSONResponse:
        return error_response(503, str(e))

    @app.get("/health", responses=_responses(503))
    async def health(raw: Request) -> Health:
        raw.app.state.ctx.client.check_alive()
        return Health()

    @app.get("/v1/models", responses=_responses(401))
    async def models(raw: Request) -> dict[str, Any]:
        ctx: ServingContext = raw.app.state.ctx
        # vLLM's card, without the server's file paths: root is the served name too. Clients that
        # need the tokenizer's folder ask /get_model_info (SGLang's route), which needs the API key.
        card = {"id": ctx.model_name, "object": "model", "created": created(), "owned_by": "minisgl",
                "root": ctx.model_name, "parent": None,
                "max_model_len": ctx.client.info.max_seq_len if ctx.client.info else None}
        return {"object": "list", "data": [card]}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(raw: Request) -> Response:
        """Prometheus text format."""
        return Response(raw.app.state.ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/server_info", responses=_responses(401))
    async def server_info(raw: Request) -> dict[str, Any]:
        """Limits, live pool stats (null once the engine is gone), the child pids and, if the engine died, why."""
        client = raw.app.state.ctx.client
        return {
            "model": raw.app.state.ctx.model_name,
            "info": dataclasses.asdict(client.info) if client.info else None,
            "stats": dataclasses.asdict(client.stats) if client.stats else None,
            "idle_checked": client.idle_checked,
            "requests_in_flight": client.num_in_flight,  # engine requests (choices) this server waits on
            "engine_pid": client.engine_pid,
            "detokenizer_pid": client.detokenizer_pid,
            "dead_reason": client.dead_reason,
        }

    @app.post("/abort_request", responses=_responses(400, 401, 408, 413))
    async def abort_request(body: AbortBody, raw: Request) -> dict[str, int]:
        """Abort the request whose response carries exactly this id (every choice still running).
        Each aborted choice still gets its reply: finish_reason "abort" with what it produced so far."""
        return {"aborted": raw.app.state.ctx.client.abort_request_id(body.rid)}

    @app.post("/flush_cache", responses=_responses(401, 503))
    @app.post("/reset_prefix_cache", responses=_responses(401, 503))  # vLLM's name
    async def flush_cache(raw: Request) -> dict[str, str]:
        """Drop the prefix cache (SGLang's route; vLLM's /reset_prefix_cache): requests sent after
        the reply reuse nothing cached before it. Running requests keep what they reuse."""
        raw.app.state.ctx.client.flush_cache()
        return {"message": "Cache flushed."}

    app.include_router(native_routes.router, responses=_responses(400, 401, 404, 408, 413, 503))
    generation = _responses(400, 401, 404, 408, 413, 503, **{"200": _STREAM})
    app.post("/v1/completions", responses=generation)(create_completion)
    app.post("/v1/chat/completions", responses=generation)(create_chat_completion)
    app.post("/generate", responses=generation)(create_generate)  # SGLang's native route
    return app
