"""The observability group: request traces over OTLP, the doors' slow requests and the
per-request JSON log line (core/tracing.py, router/frontdoor/slow_requests.py,
router/frontdoor/door_trace.py; docs/observability.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from core.tracing import TracingConfig
from router.cli.config.knob import default_of, knob


@dataclass(frozen=True)
class ObservabilityOptions:
    TITLE: ClassVar[str] = "observability"
    ABOUT: ClassVar[str] = (
        "request traces (OpenTelemetry, OTLP/gRPC), slow requests and request log lines"
    )

    otlp_traces_endpoint: str | None = knob(
        None,
        "send every request's trace (door, routing, gate, reserve, prefill, KV transfer, "
        "admission, decode) to this OTLP/gRPC collector, e.g. 127.0.0.1:4317; the front doors "
        "and every worker export to it",
        default_doc="off (no span is created)",
        metavar="HOST:PORT",
    )
    otlp_traces_sample_ratio: float = knob(
        default_of(TracingConfig, "sample_ratio"),
        "share of new traces kept, in [0, 1]; a request that brings a traceparent follows "
        "its caller's sampling decision",
        minimum=0,
        metavar="RATIO",
    )
    slow_requests: int = knob(
        default_of(TracingConfig, "slow_requests"),
        "keep this many of the slowest requests of the last 10 minutes (by TTFT and by "
        "end-to-end) with their span timeline at each front door, shown on the admin "
        "dashboard; needs no collector; 0: off",
        minimum=0,
        metavar="N",
    )
    log_requests_json: bool = knob(
        False,
        "log one JSON line per generate request at the door (ids, tenant, tokens, TTFT, "
        "end-to-end, workers, retries, trace id) on the baton.requests logger",
    )

    def tracing_config(self) -> TracingConfig:
        return TracingConfig(
            self.otlp_traces_endpoint, self.otlp_traces_sample_ratio, self.slow_requests
        )
