"""One request at the door, as its trace and its log line see it.

A door (HTTP middleware, gRPC handler) opens a `DoorTrace` for each generate request: the
root span (`baton.request`, a child of the caller's `traceparent` when one came) and the
`RequestRecord` the JSON log line prints (and the root span's attributes, which the door's
slow-request keeper reads: slow_requests.py). It is installed in a context variable for the
request's duration, so the door's stages (`stage`) and the backend's request path
(router/cluster/request_path.py, through `current()`) add to it without every call in
between passing it on. With tracing (export and the slow-request keeper) and the log line all
off, no DoorTrace is opened and `current()` is None: nothing is recorded.

The log line (`--log-requests-json`), one per request when it ends:

    {"event": "request", "request_id", "tenant", "status", "prompt_tokens",
     "output_tokens", "ttft_s", "e2e_s", "prefill_worker", "decode_worker", "retries",
     "trace_id"}
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context

from core.tracing import SpanName, Tracing, parent_of, trace_id_hex
from router.frontdoor.tenants import of_api_key

request_logger = logging.getLogger("baton.requests")
"""Where the JSON request lines go (one logger, so an operator can route them apart)."""


@dataclass
class RequestRecord:
    """What the log line says of one request; the door and the request path fill it."""

    request_id: str = ""
    tenant: str = ""
    """A fingerprint of the caller's API key (never the key): who sent it, joinable."""
    status: str = "ok"
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    prefill_worker: str | None = None
    decode_worker: str | None = None
    retries: int = 0
    trace_id: str = ""


@dataclass
class DoorTrace:
    tracer: trace.Tracer
    root: trace.Span
    started: float = field(default_factory=time.monotonic)
    started_ns: int = field(default_factory=time.time_ns)
    record: RequestRecord = field(default_factory=RequestRecord)

    @property
    def context(self) -> Context:
        """The context whose current span is the root: the parent of the door's spans."""
        return trace.set_span_in_context(self.root)

    def first_token(self) -> None:
        if self.record.ttft_s is None:
            self.record.ttft_s = time.monotonic() - self.started


_CURRENT: ContextVar[DoorTrace | None] = ContextVar("baton_door_trace", default=None)


def current() -> DoorTrace | None:
    """The request's DoorTrace, or None when neither tracing nor the log line is on."""
    return _CURRENT.get()


@contextlib.contextmanager
def opened(
    tracing: Tracing, log_json: bool, headers: Mapping[str, str], api_key: str, name: str
) -> Iterator[DoorTrace | None]:
    """The root span of one request (`name`: the route or the RPC), installed for its
    duration; logged when it ends. Nothing when tracing and `log_json` are both off."""
    if not tracing.enabled and not log_json:
        yield None
        return
    root = tracing.tracer.start_span(
        SpanName.REQUEST,
        context=parent_of(headers),
        kind=trace.SpanKind.SERVER,
        attributes={"baton.door.route": name},
    )
    door = DoorTrace(tracing.tracer, root)
    door.record.tenant = of_api_key(api_key)
    door.record.trace_id = trace_id_hex(root) if tracing.exporting else ""
    token = _CURRENT.set(door)
    try:
        with trace.use_span(root, end_on_exit=False, record_exception=True):
            yield door
    except BaseException as e:
        door.record.status = type(e).__name__
        raise
    finally:
        # A streamed gRPC reply's generator may be closed from another context (the client
        # left): the variable then goes with that context.
        with contextlib.suppress(ValueError):
            _CURRENT.reset(token)
        record = door.record
        record.e2e_s = time.monotonic() - door.started
        if root.is_recording():
            root.set_attributes(_attributes(record))
        root.end()
        if log_json:
            request_logger.info(json.dumps({"event": "request", **asdict(record)}))


def _attributes(record: RequestRecord) -> dict[str, str | int | float]:
    values = {f"baton.{k}": v for k, v in asdict(record).items() if k != "trace_id"}
    return {k: v for k, v in values.items() if v is not None and v != ""}


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """A span for one of the door's own stages (template, tokenize), under the root."""
    door = _CURRENT.get()
    if door is None or not door.root.is_recording():
        yield
        return
    span = door.tracer.start_span(name, context=door.context)
    try:
        yield
    finally:
        span.end()


def parsed() -> None:
    """The request's body is read and validated: a span from its arrival to now."""
    door = _CURRENT.get()
    if door is not None and door.root.is_recording():
        span = door.tracer.start_span(
            SpanName.PARSE, context=door.context, start_time=door.started_ns
        )
        span.end()
