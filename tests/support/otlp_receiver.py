"""A real OTLP/gRPC trace receiver for tests: the collector's TraceService (from the
opentelemetry-proto package) on 127.0.0.1, keeping every span it is sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    service: str
    attributes: dict[str, Any]
    events: tuple[str, ...]
    status_code: int


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        spans = []
        for rs in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(ReceivedSpan(
                        s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                        s.start_time_unix_nano, s.end_time_unix_nano, service,
                        {a.key: _value(a.value) for a in s.attributes},
                        tuple(e.name for e in s.events), s.status.code,
                    ))  # fmt: skip
        with self.receiver.lock:
            self.receiver.spans.extend(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class OTLPReceiver:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[ReceivedSpan] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> OTLPReceiver:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=1).wait(5)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30.0
    ) -> list[ReceivedSpan]:
        """Every span so far once `done(spans)` holds; AssertionError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                spans = list(self.spans)
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({s.name for s in spans})
                raise AssertionError(f"spans not complete after {timeout_s} s: {names}")
            time.sleep(0.1)
