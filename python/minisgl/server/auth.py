"""--api-key: every /v1/* route and the admin routes need `Authorization: Bearer <key>`; /health,
/metrics, /version and the API docs stay open (as vLLM does), so probes and scrapers need no secret. The
key is checked before the body is read, so an unauthenticated client cannot make the server
read or parse anything."""
from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from minisgl.server.errors import error_response

ADMIN_ROUTES = frozenset({"/abort_request", "/server_info", "/tokenize", "/detokenize", "/get_model_info",
                          "/flush_cache", "/reset_prefix_cache", "/generate"})


def needs_key(path: str) -> bool:
    return path.startswith("/v1/") or path in ADMIN_ROUTES


class ApiKeyAuth:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key:
            raise ValueError("--api-key must not be empty")
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and needs_key(scope["path"]):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):  # constant time: no guessing by timing
                response = error_response(401, "a valid API key is required: send `Authorization: Bearer <key>`",
                                          headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
