"""Request traces: one OpenTelemetry trace per request, from the front door through the router
to both workers, exported over OTLP/gRPC (docs/observability.md has the span tree).

    TracingConfig        where spans go and which share of traces is kept; off by default
    Tracing(config, s)   one process's tracer: a no-op tracer when off (nothing is created,
                         nothing runs per token), else its own TracerProvider and exporter;
                         a door's `keep` processor (its slow requests) records beside it
    carry(span)          the W3C `traceparent` / `tracestate` of a span, as the request
                         records hold them across Ray (`EngineRequest.traceparent`)
    parent_of(...)       the context a carried or received traceparent names (a malformed
                         one names none: the W3C rule is to start a new trace)

Each process exports its own spans (the door's, each worker's) to the same collector, with
the parent taken from the carried traceparent: the usual shape of distributed tracing. A
worker's span then carries its own clock's times and its own resource (`service.name`), and
nothing about a span has to ride back to the door in a reply. (The other shape, workers
returning timestamps for the door to record, would add fields to every reply and lose
whatever a worker saw after its reply went out, such as the end of a KV transfer.)

The OpenTelemetry API is torch-free and small; the SDK is imported only when a provider is
made (export on, or a front door keeping its slow requests), the exporter only with export.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
EXPORT_DELAY_MS = 500
"""How long a finished span may wait in its process before it is sent: short, so a trace is
whole at the collector soon after its request ends; one export a half-second costs nothing."""
_NOOP = trace.NoOpTracer()


class SpanName:
    """Every span Baton records, in the order a disaggregated request meets them."""

    REQUEST = "baton.request"
    """The root, at the door: from the request's arrival to its last byte."""
    PARSE = "door.parse"
    CHAT_TEMPLATE = "door.chat_template"
    TOKENIZE = "door.tokenize"
    ATTEMPT = "baton.attempt"
    """One try on one (prefill, decode) pair; a retry after a worker loss is another."""
    ROUTE = "router.route"
    GATE_WAIT = "prefill_gate.wait"
    RESERVE = "decode.reserve"
    PREFILL = "prefill"
    PREFILL_QUEUED = "prefill.queued"
    PREFILL_COMPUTE = "prefill.compute"
    KV_TRANSFER = "kv_transfer"
    KV_LAYERS = "kv_transfer.layers"
    """One group of layers of a transfer (at most `MAX_LAYER_GROUPS` per transfer)."""
    ADMIT = "decode.admit"
    KV_WAIT = "decode.kv_wait"
    FIRST_TOKEN = "first_token"
    DECODE = "decode"
    """A run of `DECODE_SPAN_TOKENS` output tokens (at most `MAX_DECODE_SPANS` per attempt)."""
    FINISH = "finish"


MAX_LAYER_GROUPS = 4
DECODE_SPAN_TOKENS = 16
MAX_DECODE_SPANS = 32
"""Bounds that keep a trace's size independent of model depth and output length: the last
decode span of a long output covers all the tokens after the bound."""


@dataclass(frozen=True)
class TracingConfig:
    endpoint: str | None = None
    """The OTLP/gRPC collector (host:port, or http://host:port); None: tracing is off."""
    sample_ratio: float = 1.0
    """Share of new traces kept (ParentBased(TraceIdRatioBased)): a request that comes with
    a traceparent follows its caller's decision."""
    slow_requests: int = 20
    """How many of the slowest recent requests each front door keeps with their door-side
    spans for the admin dashboard, whatever is exported (router/frontdoor/slow_requests.py);
    0: none. Workers ignore it."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio must be in [0, 1], got {self.sample_ratio}")
        if self.slow_requests < 0:
            raise ValueError(f"slow_requests must be >= 0, got {self.slow_requests}")

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)


class Tracing:
    """One process's tracer. Off: the API's no-op tracer, whose spans record nothing, so
    callers skip even the attributes (`span.is_recording()`).

    `keep`: a span processor that keeps spans in this process (a front door's slow
    requests). With it there is a provider even when nothing is exported, and every span
    records: the export still samples (a span outside the sampled share records but is not
    sampled, and the exporter skips it), so the door sees every request."""

    def __init__(
        self, config: TracingConfig | None = None, service_name: str = "baton", keep: Any = None
    ) -> None:
        self.config = config or TracingConfig()
        self._provider: Any = None
        self.tracer: trace.Tracer = _NOOP
        if self.config.enabled or keep is not None:
            self._provider = _provider(self.config, service_name, keep)
            self.tracer = self._provider.get_tracer("baton")

    @property
    def enabled(self) -> bool:
        """Spans record (exported, kept locally, or both)."""
        return self._provider is not None

    @property
    def exporting(self) -> bool:
        """Spans leave this process for a collector: a trace id names something there."""
        return self._provider is not None and self.config.enabled

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Send every finished span now; False if the collector did not take them in time."""
        if self._provider is None:
            return True
        return bool(self._provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self.tracer = _NOOP


def _provider(config: TracingConfig, service_name: str, keep: Any) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

    # Nothing exported: every span records for the door's own use and none is sampled (no
    # collector holds its trace).
    sampler: Any = _record_all(ALWAYS_OFF)
    if config.enabled:
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
        if keep is not None:  # DROP becomes RECORD_ONLY: kept here, not exported
            sampler = _record_all(sampler)
    provider = TracerProvider(
        sampler=sampler, resource=Resource.create({"service.name": service_name})
    )
    if keep is not None:
        provider.add_span_processor(keep)
    if config.enabled:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        endpoint = config.endpoint or ""
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))
        provider.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MS)
        )
    return provider


def _record_all(inner: Any) -> Any:
    """`inner`'s decisions, DROP turned into RECORD_ONLY: the span records (the door's
    keeper sees it) but is not sampled (no exporter sends it, and a carried traceparent
    tells the workers not to sample its children). Unlike the SDK's AlwaysRecordSampler it
    keeps the span's start attributes, which a dropped decision's result leaves out."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class RecordAll(Sampler):
        def should_sample(  # type: ignore[no-untyped-def]
            self, parent_context, trace_id, name, kind=None, attributes=None, links=None,
            trace_state=None,
        ) -> SamplingResult:  # fmt: skip
            result = inner.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )
            if result.decision is not Decision.DROP:
                return result
            return SamplingResult(Decision.RECORD_ONLY, attributes, result.trace_state)

        def get_description(self) -> str:
            return f"RecordAll({inner.get_description()})"

    return RecordAll()


@dataclass(frozen=True)
class Carried:
    """A span's W3C trace context as text: what crosses Ray in a request record."""

    traceparent: str = ""
    tracestate: str = ""


def carry(span: trace.Span) -> Carried:
    """`span`'s traceparent (empty when it records nothing: its children would not either)."""
    if not span.is_recording():
        return Carried()
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return Carried(carrier.get("traceparent", ""), carrier.get("tracestate", ""))


def parent_of(headers: Mapping[str, str]) -> Context | None:
    """The remote parent a `traceparent` header (and its `tracestate`) names, or None when
    none came or it is malformed: then the request starts a trace of its own (W3C Trace
    Context: a receiver that cannot parse traceparent ignores it)."""
    if not headers.get("traceparent"):
        return None
    context = _PROPAGATOR.extract(headers)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def parent_of_carried(carried: Carried) -> Context | None:
    return parent_of({"traceparent": carried.traceparent, "tracestate": carried.tracestate})


def epoch_ns(monotonic_s: float) -> int:
    """A `time.monotonic()` stamp (the engines' clock) as the epoch nanoseconds spans take."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


def trace_id_hex(span: trace.Span) -> str:
    """The span's trace id as logs print it (32 hex digits; empty when not recording)."""
    context = span.get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


@contextlib.contextmanager
def ending(span: trace.Span) -> Iterator[trace.Span]:
    """End `span` when the block ends, its status an error if the block raised; unlike
    `trace.use_span` it installs nothing in the current context, so it is safe across an
    async generator's yields."""
    try:
        yield span
    except BaseException as e:
        if span.is_recording():
            span.set_status(trace.StatusCode.ERROR, f"{type(e).__name__}: {e}"[:200])
        raise
    finally:
        span.end()
