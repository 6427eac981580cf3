"""`X-Request-Id`: a client's own id for its request, echoed on the response and carried
into the ids the cluster logs, so one id finds the request in the client's logs and ours.

Every HTTP response carries the header: the client's value, or a generated one. A completion
takes it into its `id` (`chatcmpl-<X-Request-Id>`, as vLLM does) and into the id its backend
requests run under, which also gets a short unique suffix: two clients (or two retries of
one client) may send the same id at once, and request ids key KV reservations on the
workers, so they must never collide.

A pure ASGI middleware rather than Starlette's BaseHTTPMiddleware: that one runs every
response through an extra task and memory stream, a cost on each streamed event.
"""

from __future__ import annotations

import json
import re
import uuid
from contextvars import ContextVar
from typing import Any

from router.frontdoor.http.errors import error_body

HEADER = "X-Request-Id"
_HEADER_KEY = HEADER.lower().encode()
MAX_LEN = 128
_VALID = re.compile(rf"[\x21-\x7e]{{1,{MAX_LEN}}}")
"""Printable ASCII without spaces: safe in a header, a log line and a Ray task name."""

_CLIENT_ID: ContextVar[str | None] = ContextVar("baton_client_request_id", default=None)

Scope = dict[str, Any]
Message = dict[str, Any]


def for_api(prefix: str) -> tuple[str, str]:
    """(the response's `id`, the id its backend requests run under) for the current HTTP
    request."""
    client = _CLIENT_ID.get()
    if client is None:
        rid = f"{prefix}-{uuid.uuid4().hex}"
        return rid, rid
    public = f"{prefix}-{client}"
    return public, f"{public}.{uuid.uuid4().hex[:8]}"


class RequestIdMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        offered = next((v for k, v in scope["headers"] if k == _HEADER_KEY), None)
        client = None if offered is None else offered.decode("latin-1")
        if client is not None and not _VALID.fullmatch(client):
            await _reject(send, f"{HEADER}: 1 to {MAX_LEN} printable ASCII characters, no spaces")
            return
        echoed = (client or uuid.uuid4().hex).encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (_HEADER_KEY, echoed)]
                message = {**message, "headers": headers}
            await send(message)

        token = _CLIENT_ID.set(client)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _CLIENT_ID.reset(token)


async def _reject(send: Any, message: str) -> None:
    body = json.dumps(error_body(400, message, "invalid_value", HEADER)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})
