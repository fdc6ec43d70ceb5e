"""Request bodies are validated strictly (a string is never read as a number, nor 0 as false), as
the OpenAPI schema says. JSON itself has one number type, though: 917.0 and 917 are the same value,
and the schema's `integer` accepts both. So a body's whole numbers are parsed as ints before the
strict models see them (a float field takes an int as it is)."""
from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response


def _number(literal: str) -> float | int:
    x = float(literal)
    return int(x) if x.is_integer() else x


class _JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), parse_float=_number)
        return self._json


class JsonNumbersRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_JsonRequest(request.scope, request.receive))

        return route
