"""The HTTP front door: an OpenAI-compatible API, health, Prometheus metrics and the admin
dashboard, as one FastAPI app over any `Backend` (the cluster or a `LocalBackend`)."""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import secrets
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from core.tracing import Tracing
from router.frontdoor.adapters import AdapterRegistry, UnknownAdapterError
from router.frontdoor.admin_api import ClusterAdmin
from router.frontdoor.backend import Backend
from router.frontdoor.http.adapter_routes import adapter_routes, admin_adapter_routes
from router.frontdoor.http.admin_routes import (
    _bearer,
    admin_router,
    is_authorized,
    refresh_cluster_metrics,
)
from router.frontdoor.http.chat import create_chat_completion
from router.frontdoor.http.completions import create_completion
from router.frontdoor.http.context import ServerContext
from router.frontdoor.http.disconnect import until_disconnect
from router.frontdoor.http.errors import APIError, install_error_handlers
from router.frontdoor.http.guard import DoorGuard
from router.frontdoor.http.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from router.frontdoor.http.request_ids import HEADER, RequestIdMiddleware
from router.frontdoor.http.token_routes import token_router
from router.frontdoor.http.tracing import TraceMiddleware
from router.frontdoor.limits import DoorControls, DoorLimits
from router.frontdoor.metrics import Metrics
from router.frontdoor.reasoning import PARSERS as REASONING_PARSERS
from router.frontdoor.tenants import tenant_of
from router.frontdoor.tools.parsers import DEFAULT_PARSER, get_parser

if TYPE_CHECKING:  # it imports the OpenTelemetry SDK, which only a keeping door needs
    from router.frontdoor.slow_requests import SlowRequests

logger = logging.getLogger(__name__)
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse}
    for status in (400, 401, 404, 429, 499, 500, 503, 504)
}  # fmt: skip
_METRICS_REFRESH_TIMEOUT_S = 5.0


def create_app(
    backend: Backend,
    admin: ClusterAdmin | None = None,
    *,
    api_key: str | None = None,
    admin_token: str | None = None,
    metrics: Metrics | None = None,
    request_timeout_s: float = 300.0,
    tool_call_parser: str = DEFAULT_PARSER,
    reasoning_parser: str | None = None,
    cors_origins: tuple[str, ...] = (),
    limits: DoorLimits | DoorControls | None = None,
    tracing: Tracing | None = None,
    log_requests_json: bool = False,
    slow_requests: SlowRequests | None = None,
    tenant_header: str | None = None,
    adapters: AdapterRegistry | None = None,
) -> FastAPI:
    """`admin_token=None` generates one (logged, and kept in `app.state.admin_token`).
    `cors_origins`: the browser origins allowed to call the API (`--allowed-origins`); none
    by default, so no page elsewhere can script it. `limits`: rate limits, quotas, admission
    queue and body size (guard.py); none if None; `DoorControls` to share their state with
    the gRPC door. `tracing`: the request spans' tracer (off when None);
    `log_requests_json`: one JSON log line per generate request (door_trace.py);
    `slow_requests`: the keeper on `tracing`'s provider that /admin/api/slow-requests reads
    (slow_requests.py; none: the dashboard says it is off). `tenant_header`: the header
    naming a request's tenant (tenants.py; else its API key's hash). `adapters`: the LoRA
    adapters `model` may name (adapters.py; none loaded if None)."""
    metrics = metrics or Metrics()
    if admin_token is None:
        admin_token = secrets.token_urlsafe(24)
        logger.warning("admin token (dashboard: /admin?token=...): %s", admin_token)
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {reasoning_parser!r}")
    adapters = adapters or AdapterRegistry(backend.model_name)
    ctx = ServerContext(
        backend,
        metrics,
        request_timeout_s,
        get_parser(tool_call_parser),
        reasoning_parser,
        adapters,
    )
    app = FastAPI(title="Baton", version="1", description="OpenAI-compatible LLM serving.")
    app.state.admin_token = admin_token
    app.state.metrics = metrics
    app.state.context = ctx
    install_error_handlers(app)
    # The last added runs first: request ids on every answer (a 429 too), CORS headers on
    # the guard's refusals, and preflights never counted against a limit.
    controls = DoorControls(limits) if isinstance(limits, DoorLimits) else limits
    if controls is not None and controls.limits.enabled():
        app.add_middleware(DoorGuard, controls=controls)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", HEADER],
            expose_headers=[HEADER, "Retry-After"],
        )
    app.add_middleware(RequestIdMiddleware)
    # Outermost: the root span covers the guard's wait and every byte of the reply.
    app.add_middleware(
        TraceMiddleware, tracing=tracing or Tracing(), log_requests_json=log_requests_json
    )

    async def check_api_key(request: Request) -> None:
        if api_key is None:
            return
        offered = _bearer(request)
        if offered is None or not hmac.compare_digest(offered, api_key):
            raise APIError(401, "missing or invalid API key", "invalid_api_key")

    def check_model(model: str) -> None:
        try:
            adapters.resolve(model)
        except UnknownAdapterError:
            loaded = "".join(f", {n!r}" for n in adapters.names()[:8])
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves "
                f"{backend.model_name!r}{loaded}",
                "model_not_found",
                "model",
            ) from None

    api = [Depends(check_api_key)]

    @app.get("/v1/models", dependencies=api, response_model=ModelList, responses=_ERRORS)
    async def models() -> ModelList:
        base, size = backend.model_name, backend.max_model_len
        cards = [ModelCard(id=base, created=0, max_model_len=size)]
        for ref in filter(None, map(adapters.get, adapters.names())):
            cards.append(ModelCard(id=ref.name, created=0, max_model_len=size, root=ref.path,
                                   parent=base))  # fmt: skip
        return ModelList(data=cards)

    post = functools.partial(app.post, dependencies=api, responses=_ERRORS)

    @post("/v1/completions", response_model=CompletionResponse)
    async def completions(body: CompletionRequest, request: Request) -> object:
        check_model(body.model)
        tenant = tenant_of(request.headers.items(), tenant_header)
        return await until_disconnect(request, create_completion(body, ctx, tenant))

    @post("/v1/chat/completions", response_model=ChatCompletionResponse)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> object:
        check_model(body.model)
        tenant = tenant_of(request.headers.items(), tenant_header)
        return await until_disconnect(request, create_chat_completion(body, ctx, tenant))

    app.include_router(token_router(backend, check_model, dependencies=api, responses=_ERRORS))
    app.include_router(adapter_routes(adapters, dependencies=api, responses=_ERRORS))
    app.include_router(admin_adapter_routes(adapters, lambda r: is_authorized(r, admin_token)))

    @app.get("/health", responses={503: {"model": ErrorResponse}})
    async def health() -> JSONResponse:
        if backend.is_ready():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(request: Request) -> Response:
        if admin is not None:
            try:
                await asyncio.wait_for(
                    refresh_cluster_metrics(admin, metrics), _METRICS_REFRESH_TIMEOUT_S
                )
            except Exception:  # a slow controller must not break scraping
                logger.warning("could not refresh cluster metrics", exc_info=True)
        body, content_type = metrics.exposition(request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    app.include_router(admin_router(admin, admin_token, metrics, slow_requests))
    return app
