"""Every failure as OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`,
with the status a client expects (429 carries Retry-After)."""

from __future__ import annotations

import json
import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.errors import BatonError, OverloadedError, error_message

logger = logging.getLogger(__name__)

# status -> OpenAI's error `type`.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    """An error the HTTP layer itself raises (auth, unknown model, ...)."""

    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> dict[str, dict[str, str | None]]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    status: int, message: str, code: str | None = None, param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:  # fmt: skip
    return JSONResponse(error_body(status, message, code, param), status, headers=headers)


def baton_error_response(e: BatonError) -> JSONResponse:
    headers = None
    if isinstance(e, OverloadedError):
        headers = {"Retry-After": str(max(1, math.ceil(e.retry_after_s)))}
    return error_response(e.status, error_message(e), e.code, headers=headers)


def sse_error(e: BaseException) -> str:
    """An error after the stream started: one `data:` event in the same shape."""
    if isinstance(e, BatonError):
        body = error_body(e.status, error_message(e), e.code)
    else:
        body = error_body(500, "internal error", "internal_error")
    return f"data: {json.dumps(body)}\n\n"


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if tuple(first.get("loc", ())) == ("body",):
        return "the request body must be a JSON object", None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":  # OpenAI's words for an unknown field
        return f"Unrecognized request argument supplied: {param}", param
    what = f"{param}: " if param else ""
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return f"{what}{first.get('msg', 'invalid value')}{more}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, "invalid_value", param)

    @app.exception_handler(BatonError)
    async def _baton(_: Request, exc: BatonError) -> JSONResponse:
        return baton_error_response(exc)

    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return error_response(exc.status, exc.message, exc.code, exc.param, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers) if exc.headers else None
        return error_response(exc.status_code, str(exc.detail), None, headers=headers)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in a request")
        return error_response(500, "internal error", "internal_error")
