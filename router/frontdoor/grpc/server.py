"""The gRPC front door (grpc.aio): `baton.v1.GenerateService`, `baton.v1.AdminService`,
the standard `grpc.health.v1` health service and server reflection.

Deadlines and cancellation propagate: a call's remaining deadline becomes the request's
timeout, and a cancelled (or expired) call cancels the handler task, which closes the
backend stream, which aborts the request and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from core.errors import (
    BatonError,
    CancelledError,
    DeadlineExceededError,
    InvalidRequestError,
    OverloadedError,
    WorkerFailedError,
    error_message,
)
from core.lora import LoRARef
from core.request import RequestOutput
from core.tracing import Tracing
from proto.baton.v1 import admin_pb2, admin_pb2_grpc, generate_pb2, generate_pb2_grpc
from router.frontdoor import door_trace
from router.frontdoor.adapters import AdapterRegistry, UnknownAdapterError
from router.frontdoor.admin_api import ClusterAdmin
from router.frontdoor.backend import Backend, GenerateRequest
from router.frontdoor.grpc import convert
from router.frontdoor.grpc.auth import BearerAuth, bearer
from router.frontdoor.grpc.tools import tool_calls, tool_request
from router.frontdoor.limits import DoorControls, DoorLimits, Refusal
from router.frontdoor.metrics import Metrics
from router.frontdoor.requests import new_request_id, tokenizer_of
from router.frontdoor.tenants import tenant_of
from router.frontdoor.tools.calls import ToolRequest
from router.frontdoor.tools.constraint import forced_call_constraint
from router.frontdoor.tools.parsers import DEFAULT_PARSER, get_parser
from router.frontdoor.tools.reader import ToolCallReader
from router.frontdoor.tracking import run_tracked

logger = logging.getLogger(__name__)
_HEALTH_POLL_S = 1.0
_STATUS = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    OverloadedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DeadlineExceededError: grpc.StatusCode.DEADLINE_EXCEEDED,
    WorkerFailedError: grpc.StatusCode.UNAVAILABLE,
    CancelledError: grpc.StatusCode.CANCELLED,
}
SERVICE_NAMES = (
    generate_pb2.DESCRIPTOR.services_by_name["GenerateService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
)


_REFUSED = {429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}


async def _refuse(context: grpc.aio.ServicerContext, refusal: Refusal) -> None:
    """A door limit said no (the HTTP door's 429 / 503): the same message and retry hint."""
    retry = str(max(1, math.ceil(refusal.retry_after_s)))
    context.set_trailing_metadata((("retry-after", retry),))
    await context.abort(_REFUSED.get(refusal.status, grpc.StatusCode.UNAVAILABLE), refusal.message)


async def _abort(context: grpc.aio.ServicerContext, e: BatonError) -> None:
    code = next((c for t, c in _STATUS.items() if isinstance(e, t)), grpc.StatusCode.INTERNAL)
    if isinstance(e, OverloadedError):
        retry = str(max(1, math.ceil(e.retry_after_s)))
        context.set_trailing_metadata((("retry-after", retry),))
    await context.abort(code, error_message(e))


class GenerateServicer(generate_pb2_grpc.GenerateServiceServicer):
    def __init__(
        self,
        backend: Backend,
        metrics: Metrics,
        request_timeout_s: float,
        tool_call_parser: str = DEFAULT_PARSER,
        controls: DoorControls | None = None,
        tracing: Tracing | None = None,
        log_requests_json: bool = False,
        tenant_header: str | None = None,
        adapters: AdapterRegistry | None = None,
    ) -> None:
        self.backend = backend
        self.tenant_header = tenant_header
        self.adapters = adapters or AdapterRegistry(backend.model_name)
        self.tracing = tracing or Tracing()
        self.log_requests_json = log_requests_json
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self.tool_parser = get_parser(tool_call_parser)
        self.controls = controls

    def _traced(self, context: grpc.aio.ServicerContext, rpc: str) -> Any:
        """The request's root span (a child of a `traceparent` in the call's metadata) and
        its log line (router/frontdoor/door_trace.py)."""
        metadata = dict(context.invocation_metadata() or ())
        headers = {k: str(metadata[k]) for k in ("traceparent", "tracestate") if k in metadata}
        key = bearer(metadata.items()) or ""
        return door_trace.opened(self.tracing, self.log_requests_json, headers, key, rpc)

    @contextlib.asynccontextmanager
    async def _admitted(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """The door's limits around one generate call (nothing when none are set)."""
        async with contextlib.AsyncExitStack() as stack:
            if self.controls is not None:
                key = bearer(context.invocation_metadata()) or ""  # no key: the anonymous one
                try:
                    await stack.enter_async_context(self.controls.admitted(key))
                except Refusal as refusal:
                    await _refuse(context, refusal)  # raises: the call ends here
            yield

    def _request(
        self, msg: generate_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> tuple[GenerateRequest, ToolRequest | None]:
        b = self.backend
        tools = tool_request(msg.chat) if msg.WhichOneof("prompt") == "chat" else None
        ids = convert.prompt_token_ids(msg, tokenizer_of(b))
        forced = forced_call_constraint(tools) if tools is not None else None
        params = convert.sampling_params(msg.sampling, len(ids), b.max_model_len, forced)
        if tools is not None and tools.choice == "auto" and self.tool_parser.keeps_special_tokens:
            params = replace(params, skip_special_tokens=False)  # its call marker is one
        remaining = context.time_remaining()
        timeout = self.request_timeout_s if remaining is None else remaining
        rid = msg.request_id or new_request_id("grpc")
        metadata = [(k, str(v)) for k, v in context.invocation_metadata() or ()]
        tenant = tenant_of(metadata, self.tenant_header)
        timeout_s = min(timeout, self.request_timeout_s)
        lora = self._lora(msg.model)
        return GenerateRequest(rid, ids, params, timeout_s, msg.priority, tenant, lora), tools

    def _lora(self, model: str) -> LoRARef | None:
        try:
            return self.adapters.resolve(model or self.adapters.base_model)
        except UnknownAdapterError:
            raise InvalidRequestError(
                f"model: {model!r} is neither {self.adapters.base_model!r} nor a loaded LoRA "
                "adapter"
            ) from None

    def _with_calls(
        self, msg: generate_pb2.GenerateResponse, tools: ToolRequest | None, text: str
    ) -> generate_pb2.GenerateResponse:
        """The finished message of a chat with tools: its calls and content."""
        if tools is not None and msg.finished:
            content, calls = ToolCallReader(tools, self.tool_parser).content_of(text)
            msg.tool_calls.extend(tool_calls(calls))
            msg.content = content or ""
        return msg

    async def Generate(
        self, request: generate_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[generate_pb2.GenerateResponse]:
        with self._traced(context, "Generate"):
            async for msg in self._generate(request, context):
                yield msg

    async def _generate(
        self, request: generate_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[generate_pb2.GenerateResponse]:
        door_trace.parsed()
        async with self._admitted(context):
            try:
                req, tools = self._request(request, context)
                num_tokens, text = 0, ""
                async for out in run_tracked(self.backend, req, self.metrics):
                    num_tokens += len(out.new_token_ids)
                    text += out.new_text if tools is not None else ""
                    if not out.new_token_ids and not out.finished:
                        continue
                    num_prompt = len(req.prompt_token_ids)
                    msg = convert.response(out, req.request_id, num_prompt, num_tokens)
                    yield self._with_calls(msg, tools, text)
            except BatonError as e:
                await _abort(context, e)

    async def GenerateUnary(
        self, request: generate_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> generate_pb2.GenerateResponse:
        with self._traced(context, "GenerateUnary"):
            return await self._generate_unary(request, context)

    async def _generate_unary(
        self, request: generate_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> generate_pb2.GenerateResponse:
        door_trace.parsed()
        async with self._admitted(context):
            try:
                req, tools = self._request(request, context)
                whole = RequestOutput(req.request_id, req.prompt_token_ids)
                async for out in run_tracked(self.backend, req, self.metrics):
                    whole.add(out)
            except BatonError as e:
                await _abort(context, e)
        if not whole.finished:
            await context.abort(grpc.StatusCode.INTERNAL, "the backend returned no output")
        num_prompt = len(req.prompt_token_ids)
        msg = convert.response(whole, req.request_id, num_prompt, len(whole.token_ids))
        return self._with_calls(msg, tools, whole.text)

    async def Tokenize(
        self, request: generate_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> generate_pb2.TokenizeResponse:
        try:
            ids = convert.prompt_token_ids(request, tokenizer_of(self.backend))
        except BatonError as e:
            await _abort(context, e)
        return generate_pb2.TokenizeResponse(
            token_ids=ids, max_model_len=self.backend.max_model_len
        )


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """Every call carries the admin token (checked by auth.BearerAuth before it gets here)."""

    def __init__(self, admin: ClusterAdmin) -> None:
        self.admin = admin

    async def _state(self) -> admin_pb2.ClusterState:
        return convert.cluster_state(await self.admin.state())

    async def GetClusterState(self, request, context):  # type: ignore[no-untyped-def]
        return await self._state()

    async def ScalePool(self, request, context):  # type: ignore[no-untyped-def]
        try:
            await self.admin.scale(request.pool, request.size)
        except BatonError as e:
            await _abort(context, e)
        return await self._state()

    async def DrainWorker(self, request, context):  # type: ignore[no-untyped-def]
        try:
            await self.admin.drain(request.worker_id)
        except InvalidRequestError as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return await self._state()


class GRPCServer:
    """A started `grpc.aio` server; create with `await GRPCServer.start(...)` on the loop
    that will serve it (the backend's streams live on that loop)."""

    def __init__(self, server: grpc.aio.Server, port: int, health_task: asyncio.Task) -> None:
        self.server = server
        self.port = port
        self._health_task = health_task

    @classmethod
    async def start(
        cls,
        backend: Backend,
        admin: ClusterAdmin | None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        admin_token: str,
        api_key: str | None = None,
        metrics: Metrics | None = None,
        request_timeout_s: float = 300.0,
        tool_call_parser: str = DEFAULT_PARSER,
        limits: DoorLimits | DoorControls | None = None,
        tracing: Tracing | None = None,
        log_requests_json: bool = False,
        tenant_header: str | None = None,
        adapters: AdapterRegistry | None = None,
    ) -> GRPCServer:
        """`api_key`: generate calls must carry it (as the HTTP API's do); admin calls always
        carry `admin_token`. `limits`: the door's rate limits, quotas and admission queue
        (RESOURCE_EXHAUSTED / UNAVAILABLE with `retry-after`), and its largest request
        message; the HTTP door's `DoorControls` to share their counts. `tenant_header`: the
        metadata key naming a request's tenant (router/frontdoor/tenants.py). `adapters`: the
        LoRA adapters `model` may name (the HTTP door's, to share its loads)."""
        tokens = {SERVICE_NAMES[1]: admin_token}
        if api_key is not None:
            tokens[SERVICE_NAMES[0]] = api_key
        controls = DoorControls(limits) if isinstance(limits, DoorLimits) else limits
        options = []
        if controls is not None and controls.limits.max_body_bytes is not None:
            options.append(("grpc.max_receive_message_length", controls.limits.max_body_bytes))
        if controls is not None and not controls.limits.enabled():
            controls = None
        server = grpc.aio.server(interceptors=[BearerAuth(tokens)], options=options)
        metrics = metrics or Metrics()
        servicer = GenerateServicer(
            backend, metrics, request_timeout_s, tool_call_parser, controls, tracing,
            log_requests_json, tenant_header, adapters,
        )  # fmt: skip
        generate_pb2_grpc.add_GenerateServiceServicer_to_server(servicer, server)
        names = [SERVICE_NAMES[0]]
        if admin is not None:
            admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(admin), server)
            names.append(SERVICE_NAMES[1])
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        names.append(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection([*names, reflection.SERVICE_NAME], server)
        try:  # grpcio returns 0 or (newer releases) raises when the port cannot be bound
            bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise OSError(errno.EADDRINUSE, "address already in use")
        await server.start()
        task = asyncio.get_running_loop().create_task(_track_health(backend, health))
        logger.info("gRPC listening on %s:%d", host, bound)
        return cls(server, bound, task)

    async def stop(self, grace_s: float = 1.0) -> None:
        self._health_task.cancel()
        await self.server.stop(grace_s)


async def _track_health(backend: Backend, health: health_aio.HealthServicer) -> None:
    """Mirror `backend.is_ready()` into the health service ("" and GenerateService)."""
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    while True:
        status = serving if backend.is_ready() else not_serving
        for name in ("", SERVICE_NAMES[0]):
            await health.set(name, status)
        await asyncio.sleep(_HEALTH_POLL_S)
