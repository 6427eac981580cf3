"""`DoorGuard`: the ASGI middleware that applies `limits.DoorLimits` before a request
reaches a route, so a refused request costs no parsing, no tokenizing and no engine work.

Per request to the API (`/v1/...`), in order:
 1. body size: a Content-Length over the limit, or a body that grows past it -> 413;
 2. the API key's quotas (`Authorization: Bearer <key>`; none: the anonymous key) -> 429;
 3. a slot of the whole door, waiting in the bounded queue if need be -> 503.
What it charged is given back when the route's ASGI call returns: a finished response, an
error, or a streaming client that went away (Starlette cancels the stream then).

A plain ASGI middleware rather than Starlette's BaseHTTPMiddleware, which runs the route in
another task and does not see a streaming response end.
"""

from __future__ import annotations

from typing import Any

from router.frontdoor.http.errors import error_response
from router.frontdoor.limits import DoorControls, Refusal

_GENERATION = ("/v1/completions", "/v1/chat/completions")


class DoorGuard:
    def __init__(self, app: Any, controls: DoorControls) -> None:
        self.app = app
        self.limits = controls.limits
        self.quotas = controls.quotas
        self.admission = controls.admission

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        try:
            if self.limits.max_body_bytes is not None:
                receive = await self._bounded_body(scope, receive)
            generation = scope["method"] == "POST" and scope["path"] in _GENERATION
            if not generation:
                await self.app(scope, receive, send)
                return
            key = _api_key(scope)
            self.quotas.acquire(key)
        except Refusal as refusal:
            await _refuse(refusal, scope, receive, send)
            return
        try:
            if self.admission is not None:
                try:
                    await self.admission.enter()
                except Refusal as refusal:
                    await _refuse(refusal, scope, receive, send)
                    return
                try:
                    await self.app(scope, receive, send)
                finally:
                    self.admission.leave()
            else:
                await self.app(scope, receive, send)
        finally:
            self.quotas.release(key)

    async def _bounded_body(self, scope: dict, receive: Any) -> Any:
        """Read the body (refusing it past the limit) and hand it on as one message."""
        limit = self.limits.max_body_bytes
        assert limit is not None
        too_big = Refusal(
            413,
            f"the request body is larger than this server's limit of {limit} bytes",
            "request_too_large",
            0,
        )
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise too_big
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: pass that on
                return _replay([message], receive)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        return _replay([body], receive)


def _replay(messages: list[dict], receive: Any) -> Any:
    """A receive() that yields `messages` first, then the real one (disconnects)."""
    pending = list(messages)

    async def replayed() -> dict:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _api_key(scope: dict) -> str:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


async def _refuse(refusal: Refusal, scope: dict, receive: Any, send: Any) -> None:
    headers = {"Retry-After": str(refusal.retry_after_s)} if refusal.status != 413 else None
    response = error_response(refusal.status, refusal.message, refusal.code, headers=headers)
    await response(scope, receive, send)
