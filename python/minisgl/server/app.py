"""The FastAPI app: OpenAI-compatible routes, health, metrics, abort and server info. Every error
is an OpenAI-shaped body with a message: 400 for bad input, 404 for an unknown model or route,
503 (with the reason) once the engine is gone."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from minisgl.server.chat import create_chat_completion
from minisgl.server.completions import create_completion
from minisgl.server.engine_client import EngineUnavailable
from minisgl.server.openai_types import AbortBody
from minisgl.server.serving import ApiError, ServingContext, created, error_response

logger = logging.getLogger(__name__)

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Bad request: the message says what was wrong"},
    404: {"description": "Unknown model"},
    503: {"description": "The engine is unavailable: the message says why"},
}


def _validation_message(e: RequestValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        if err.get("type") == "json_invalid":
            return f"malformed JSON: {err.get('ctx', {}).get('error', err.get('msg'))}"
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


def build_app(make_context: Callable[[], ServingContext], startup_timeout: float) -> FastAPI:
    """make_context runs inside the event loop, at start-up; start-up waits for the engine."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = make_context()
        app.state.ctx = ctx
        info = await ctx.client.start(startup_timeout)
        logger.info(
            "ready: serving %s (%s); %d KV pages of %d tokens, %d request/state slots, max_seq_len %d; engine ready "
            "in %.1f s, warm-up %.1f s with %d Triton compiles/autotunes",
            ctx.model_name, info.device, info.total_pages, info.page_size, info.max_running_requests, info.max_seq_len,
            info.startup_seconds, info.warmup_seconds, info.warmup_compiles,
        )
        try:
            yield
        finally:
            await ctx.client.stop()

    app = FastAPI(title="minisgl", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return error_response(e.status, e.message, e.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(400, _validation_message(e))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, e: HTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail))

    @app.exception_handler(EngineUnavailable)
    async def _unavailable(_: Request, e: EngineUnavailable) -> JSONResponse:
        return error_response(503, str(e))

    @app.get("/health", responses=_ERROR_RESPONSES)
    async def health(raw: Request) -> Response:
        raw.app.state.ctx.client.check_alive()
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(raw: Request) -> dict[str, Any]:
        ctx: ServingContext = raw.app.state.ctx
        card = {"id": ctx.model_name, "object": "model", "created": created(), "owned_by": "minisgl",
                "root": ctx.client.info.model_path if ctx.client.info else None,
                "max_model_len": ctx.client.info.max_seq_len if ctx.client.info else None}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics(raw: Request) -> Response:
        return Response(raw.app.state.ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/server_info")
    async def server_info(raw: Request) -> dict[str, Any]:
        """Limits, live pool stats, the engine's pid and, if it died, why."""
        client = raw.app.state.ctx.client
        return {
            "model": raw.app.state.ctx.model_name,
            "info": dataclasses.asdict(client.info) if client.info else None,
            "stats": dataclasses.asdict(client.stats) if client.stats else None,
            "idle_checked": client.idle_checked,
            "engine_pid": client.engine_pid,
            "dead_reason": client.dead_reason,
        }

    @app.post("/abort_request", responses=_ERROR_RESPONSES)
    async def abort_request(body: AbortBody, raw: Request) -> dict[str, int]:
        """Abort a request by the id its response carries (every choice), or one choice's rid."""
        return {"aborted": raw.app.state.ctx.client.abort_request_id(body.rid)}

    app.post("/v1/completions", responses=_ERROR_RESPONSES)(create_completion)
    app.post("/v1/chat/completions", responses=_ERROR_RESPONSES)(create_chat_completion)
    return app
