"""Errors as clients read them: OpenAI's error shape, which the openai client turns into
BadRequestError and friends, and the exception handlers and middleware raise to send one."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from starlette.responses import JSONResponse

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    503: "service_unavailable_error",
}


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": status}}


def error_response(
    status: int, message: str, param: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    """The body of every error response (for the OpenAPI schema)."""

    error: ErrorDetail
