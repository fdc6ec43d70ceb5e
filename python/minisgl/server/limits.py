"""Request body limits, enforced before the app sees a request: the whole body is read within
--body-read-timeout seconds and at most --max-request-body-bytes bytes, or the client gets a 408
or a 413 and the connection is closed. A body announced too large by its Content-Length is refused
without reading it. The app then reads the buffered body; later receive() calls (which tell a
handler that its client left) go to the connection as before."""
from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minisgl.server.errors import error_response

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
_CLOSE = {"Connection": "close"}  # the rest of a refused body is never read: the connection cannot be reused


class BodyLimits:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY:
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(413, f"the request body has {int(length)} bytes", scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while True:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:  # (not the builtin before Python 3.11)
                await self._refuse(408, f"the request body did not arrive within {self.timeout_s:g} s "
                                        f"(--body-read-timeout)", scope, receive, send)
                return
            if msg["type"] == "http.disconnect":
                return  # the client left: nobody to answer
            size += len(msg.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(413, f"the request body has more than {self.max_bytes} bytes", scope, receive, send)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                msg, body = body, None
                return msg
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, status: int, why: str, scope: Scope, receive: Receive, send: Send) -> None:
        message = why if status == 408 else f"{why}; the limit is {self.max_bytes} (--max-request-body-bytes)"
        await error_response(status, message, headers=_CLOSE)(scope, receive, send)
