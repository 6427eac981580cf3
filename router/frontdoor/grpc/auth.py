"""Who may call what on the gRPC front door, in one place (a server interceptor): the
generate service needs `authorization: Bearer <api key>` when the server has an API key (as
the HTTP API does), the admin service always needs the admin token; health and reflection
are open. A call without the right token ends with UNAUTHENTICATED before any handler runs.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc


def bearer(metadata: Any) -> str | None:
    """The bearer token of a call's `authorization` metadata, if any."""
    scheme, _, value = str(dict(metadata or ()).get("authorization", "")).partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


class BearerAuth(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: dict[str, str]) -> None:
        """`tokens`: service name (e.g. `baton.v1.AdminService`) -> the token its calls must
        carry, and what to call it in the error; services not named are open."""
        self._tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        service = details.method.lstrip("/").split("/")[0]
        token = self._tokens.get(service)
        if token is None or handler is None:
            return handler
        offered = bearer(details.invocation_metadata)
        if offered is not None and hmac.compare_digest(offered, token):
            return handler
        return _refusal(handler, f"{service} needs `authorization: Bearer <token>`")


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that ends the call with UNAUTHENTICATED."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, **serializers)
    return grpc.unary_unary_rpc_method_handler(refuse, **serializers)
