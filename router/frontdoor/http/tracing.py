"""The HTTP door's trace and log line for each generate request (door_trace.py): a pure ASGI
middleware, so the root span covers the whole exchange, a streamed body's last event
included, and a streamed response pays no extra task per event (see request_ids.py)."""

from __future__ import annotations

from typing import Any

from core.tracing import Tracing
from router.frontdoor import door_trace

GENERATE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_TRACE_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate"}


class TraceMiddleware:
    def __init__(self, app: Any, tracing: Tracing, log_requests_json: bool = False) -> None:
        self.app = app
        self.tracing = tracing
        self.log_requests_json = log_requests_json

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in GENERATE_PATHS:
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        api_key = ""
        for name, value in scope["headers"]:
            if name in _TRACE_HEADERS:
                headers[_TRACE_HEADERS[name]] = value.decode("latin-1")
            elif name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                api_key = token.strip() if scheme.lower() == "bearer" else ""
        with door_trace.opened(
            self.tracing, self.log_requests_json, headers, api_key, path
        ) as door:
            if door is None:
                await self.app(scope, receive, send)
                return

            async def send_status(message: dict) -> None:
                if message["type"] == "http.response.start" and message["status"] >= 400:
                    door.record.status = str(message["status"])
                await send(message)

            await self.app(scope, receive, send_status)
