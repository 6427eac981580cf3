"""Request traces through a real local cluster, exported over OTLP/gRPC to a real receiver
(the collector's TraceService) started here: one disaggregated request over the HTTP door is
one connected trace whose spans cover its time; an incoming traceparent is honoured (as an
HTTP header and as gRPC metadata); a
retry after a worker's death shows; sampling ratio 0 exports nothing; and the JSON log line
joins the trace."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import ray

from core.tracing import SpanName, Tracing, TracingConfig
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.support.otlp_receiver import OTLPReceiver, ReceivedSpan

pytestmark = pytest.mark.slow

FLUSH_TIMEOUT_S = 15.0
CLIENT_SLACK_S = 0.02
MESSAGES = [{"role": "user", "content": "Tell me a long story about a baton in a relay race."}]


@pytest.fixture(scope="module")
def receiver(ray_session) -> Iterator[OTLPReceiver]:
    # After Ray is up: Ray's start-up forks, which a running gRPC server's threads upset.
    r = OTLPReceiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def traced(request, receiver):  # type: ignore[no-untyped-def]
    """1 prefill + 2 decode workers (a retry has somewhere to go), every process exporting
    to `receiver`; the HTTP door with the JSON log line on: (cluster, base url)."""
    from router.frontdoor.http.app import create_app
    from tests.support.http_server import HTTPServerThread

    cluster_factory = request.getfixturevalue("cluster_factory_module")
    model_dir = request.getfixturevalue("tiny_model_dir")("llama")
    spec = make_spec(
        model_dir, num_prefill=1, num_decode=2, tracing=TracingConfig(receiver.endpoint, 1.0)
    )
    cluster = cluster_factory(spec, always_disaggregate())
    app = create_app(
        cluster.backend, admin_token="t", tracing=cluster.tracing, log_requests_json=True
    )
    http = HTTPServerThread(app).start()
    yield cluster, f"http://{http.host}:{http.port}"
    http.stop()


@pytest.fixture(autouse=True)
def request_lines(caplog: pytest.LogCaptureFixture) -> None:
    """The JSON log lines, kept for the whole test: one is written after the reply's last
    byte, which the client may read first."""
    caplog.set_level(logging.INFO, logger="baton.requests")


def flush(cluster: Any) -> None:
    """Every process sends its finished spans now (each with a timeout)."""
    assert cluster.tracing.flush(FLUSH_TIMEOUT_S)
    handles = [m.handle for m in cluster.membership.workers.values()]
    assert all(ray.get([h.flush_traces.remote(FLUSH_TIMEOUT_S) for h in handles], timeout=60))


def chat(base: str, headers: dict[str, str] | None = None, **body: Any) -> tuple[str, float]:
    """Stream one chat completion; (its X-Request-Id, the client's end-to-end seconds: from
    sending the request, on a connection already open, to the reply's last byte)."""
    rid = uuid.uuid4().hex
    headers = {"X-Request-Id": rid, **(headers or {})}
    with httpx.Client(base_url=base, timeout=120) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]  # opens the connection
        payload = {"model": model, "messages": MESSAGES, "stream": True, "max_tokens": 40,
                   "ignore_eos": True, "temperature": 0.0, **body}  # fmt: skip
        started = time.monotonic()
        with client.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as r:
            assert r.status_code == 200, r.read()
            for _ in r.iter_lines():
                pass
        return rid, time.monotonic() - started


def root_of(spans: list[ReceivedSpan]) -> ReceivedSpan:
    roots = [s for s in spans if s.name == SpanName.REQUEST]
    assert len(roots) == 1, [s.name for s in spans]
    return roots[0]


def union_s(intervals: list[tuple[int, int]], lo: int, hi: int) -> float:
    """Seconds of [lo, hi] covered by the union of `intervals`."""
    covered, reach = 0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            covered += end - start
            reach = end
    return covered / 1e9


def whole_trace(receiver: OTLPReceiver, cluster: Any, trace_id: str) -> list[ReceivedSpan]:
    flush(cluster)
    needed = {SpanName.FINISH, SpanName.KV_TRANSFER, SpanName.REQUEST}
    receiver.wait_for(lambda spans: needed <= {s.name for s in spans if s.trace_id == trace_id})
    return receiver.trace(trace_id)


def trace_id_of_log(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    """The request's JSON log line (written once the door sent the last byte: the client
    may have it first, so it is waited for)."""
    deadline = time.monotonic() + 10.0
    while True:
        records = [r for r in caplog.records if r.name == "baton.requests"]
        lines = [json.loads(r.getMessage()) for r in records]
        mine = [line for line in lines if request_id in line["request_id"]]
        if mine or time.monotonic() > deadline:
            assert len(mine) == 1, lines
            return mine[0]
        time.sleep(0.05)


def test_one_disaggregated_request_is_one_connected_trace(
    traced, receiver, caplog: pytest.LogCaptureFixture
) -> None:
    cluster, base = traced
    rid, e2e_s = chat(base)
    line = trace_id_of_log(caplog, rid)
    spans = whole_trace(receiver, cluster, line["trace_id"])
    root = root_of(spans)
    assert root.parent_span_id == ""
    by_id = {s.span_id: s for s in spans}
    assert all(s.parent_span_id in by_id for s in spans if s is not root), "a parent is missing"
    names = {s.name for s in spans}
    expected = {
        SpanName.PARSE, SpanName.CHAT_TEMPLATE, SpanName.TOKENIZE, SpanName.ATTEMPT,
        SpanName.ROUTE, SpanName.GATE_WAIT, SpanName.RESERVE, SpanName.PREFILL,
        SpanName.PREFILL_QUEUED, SpanName.PREFILL_COMPUTE, SpanName.KV_TRANSFER,
        SpanName.KV_LAYERS, SpanName.ADMIT, SpanName.KV_WAIT, SpanName.FIRST_TOKEN,
        SpanName.DECODE, SpanName.FINISH,
    }  # fmt: skip
    assert expected <= names, expected - names
    assert {s.service for s in spans} == {"baton-router", "baton-prefill", "baton-decode"}
    # The root covers the client's end-to-end time, its children (their union) the root.
    # The root cannot hold the client's and the HTTP server's own work before the door's
    # handler runs: on a loaded 2-core host that alone can be several ms of a 40-token
    # request's ~80 ms, so up to CLIENT_SLACK_S is allowed besides the 5%.
    root_s = (root.end_ns - root.start_ns) / 1e9
    assert root_s >= 0.95 * e2e_s - CLIENT_SLACK_S, (root_s, e2e_s)
    children = [(s.start_ns, s.end_ns) for s in spans if s is not root]
    # Between the children, the door's own few lines, which a loaded host can stall alike.
    assert union_s(children, root.start_ns, root.end_ns) >= 0.95 * root_s - CLIENT_SLACK_S
    # Routing says what it chose and from what; the transfer what it moved, and how.
    route = next(s for s in spans if s.name == SpanName.ROUTE)
    worker_ids = {m.worker_id for m in cluster.membership.workers.values()}
    assert set(route.attributes["baton.route.candidates"]) == worker_ids
    assert route.attributes["baton.route.decode_worker"] == line["decode_worker"]
    assert route.attributes["baton.route.prefill_worker"] == line["prefill_worker"]
    assert "baton.route.cached_blocks" in route.attributes
    kv = next(s for s in spans if s.name == SpanName.KV_TRANSFER)
    assert kv.service == "baton-prefill" and kv.attributes["baton.kv.bytes"] > 0
    assert kv.attributes["baton.kv.transport"]
    assert {"baton.kv.queued_s", "baton.kv.moving_s"} <= set(kv.attributes)
    decode_spans = [s for s in spans if s.name == SpanName.DECODE]
    covered = [s.attributes["baton.tokens.to"] - s.attributes["baton.tokens.from"]
               for s in decode_spans]  # fmt: skip
    assert sum(covered) == 40 - 1 and len(decode_spans) >= 2  # the first token: first_token
    # The log line joins the trace: the same ids and counts.
    assert line["output_tokens"] == 40 and line["prompt_tokens"] > 0
    assert line["retries"] == 0 and line["ttft_s"] <= line["e2e_s"]


def test_an_incoming_traceparent_is_honoured(traced, receiver) -> None:
    cluster, base = traced
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    chat(base, {"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "k=v"})
    spans = whole_trace(receiver, cluster, trace_id)
    assert root_of(spans).parent_span_id == parent_id


def test_a_traceparent_in_grpc_metadata_is_honoured(traced, receiver) -> None:
    import grpc

    from proto.baton.v1 import generate_pb2_grpc
    from router.frontdoor.grpc.client import build_request
    from tests.support.grpc_server import GRPCServerThread

    cluster, _ = traced
    server = GRPCServerThread(
        cluster.backend, None, admin_token="t", tracing=cluster.tracing
    ).start()
    trace_id, parent_id = "5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8"
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = generate_pb2_grpc.GenerateServiceStub(channel)
            request = build_request(MESSAGES, max_tokens=8, temperature=0.0)
            metadata = (("traceparent", f"00-{trace_id}-{parent_id}-01"),)
            replies = list(stub.Generate(request, timeout=120, metadata=metadata))
    finally:
        server.stop()
    assert replies[-1].finished
    spans = whole_trace(receiver, cluster, trace_id)
    assert root_of(spans).parent_span_id == parent_id
    assert {SpanName.PREFILL, SpanName.ADMIT, SpanName.KV_TRANSFER} <= {s.name for s in spans}


def test_a_malformed_traceparent_starts_a_new_trace(traced, receiver, caplog) -> None:
    cluster, base = traced
    rid, _ = chat(base, {"traceparent": "00-not-a-trace-01"}, max_tokens=4)
    trace_id = trace_id_of_log(caplog, rid)["trace_id"]
    assert len(trace_id) == 32
    assert root_of(whole_trace(receiver, cluster, trace_id)).parent_span_id == ""


def test_sampling_ratio_zero_exports_nothing(traced, receiver, caplog) -> None:
    """A door whose sampler keeps no trace: its root records nothing, so neither do the
    request path (ParentBased) nor the workers (no traceparent is carried)."""
    from router.frontdoor.http.app import create_app
    from tests.support.http_server import HTTPServerThread

    cluster, _ = traced
    unsampled = Tracing(TracingConfig(receiver.endpoint, 0.0), "baton-router")
    app = create_app(cluster.backend, admin_token="t", tracing=unsampled, log_requests_json=True)
    http = HTTPServerThread(app).start()
    try:
        flush(cluster)
        before = len(receiver.spans)
        rid, _ = chat(f"http://{http.host}:{http.port}", max_tokens=4)
        assert unsampled.flush(FLUSH_TIMEOUT_S)
        flush(cluster)
        time.sleep(1.0)  # past the exporters' delay: anything sent has arrived
        assert len(receiver.spans) == before
        assert trace_id_of_log(caplog, rid)["output_tokens"] == 4
    finally:
        http.stop()
        unsampled.shutdown()


def test_a_retry_after_a_worker_dies_shows_in_the_trace(traced, receiver, caplog) -> None:
    cluster, base = traced
    trace_id = "7a3c5e0f9b1d4c2e8f6a0b1c2d3e4f50"
    rid = uuid.uuid4().hex
    headers = {"traceparent": f"00-{trace_id}-1111111111111111-01", "X-Request-Id": rid}
    payload = {"model": cluster.backend.model_name, "messages": MESSAGES, "stream": True,
               "max_tokens": 600, "ignore_eos": True, "temperature": 0.0}  # fmt: skip

    def mine(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
        return [s for s in spans if s.trace_id == trace_id and s.name == name]

    url = f"{base}/v1/chat/completions"
    with (
        httpx.Client(timeout=120) as c,
        c.stream("POST", url, json=payload, headers=headers) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        chunks = 0
        for text in lines:
            chunks += text.startswith("data: {")
            if chunks == 10:
                break
        # The decode worker streaming it, as its routing span says: the one to kill (while
        # the 590 tokens left, ~1 s, still run: the spans' flush and poll come first).
        assert cluster.tracing.flush(FLUSH_TIMEOUT_S)
        spans = receiver.wait_for(lambda spans: bool(mine(spans, SpanName.ROUTE)))
        victim_id = mine(spans, SpanName.ROUTE)[0].attributes["baton.route.decode_worker"]
        ray.kill(cluster.membership.workers[victim_id].handle, no_restart=True)
        for _ in lines:
            pass
    line = trace_id_of_log(caplog, rid)
    assert line["trace_id"] == trace_id
    assert line["retries"] >= 1 and line["output_tokens"] == 600
    assert cluster.tracing.flush(FLUSH_TIMEOUT_S)
    spans = receiver.wait_for(
        lambda spans: len(mine(spans, SpanName.ATTEMPT)) >= 2 and bool(mine(spans, SpanName.FINISH))
    )
    attempts = sorted(mine(spans, SpanName.ATTEMPT), key=lambda s: s.attributes["baton.attempt"])
    assert attempts[0].status_code == 2  # ERROR: its worker died
    assert "baton.retry.reason" not in attempts[0].attributes
    assert attempts[1].attributes["baton.retry.reason"]
    assert attempts[1].attributes["baton.resumed_tokens"] >= 9
    routes = mine(spans, SpanName.ROUTE)
    assert victim_id not in {r.attributes["baton.route.decode_worker"] for r in routes[1:]}
