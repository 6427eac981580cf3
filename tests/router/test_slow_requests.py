"""The door's slow-request keeper on a real SDK tracer provider: it keeps the slowest
requests of its window by TTFT and by end to end, forgets what leaves the window, builds
each timeline from the request's own spans only, and holds a bounded amount whatever comes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace

from core.tracing import SpanName, Tracing, TracingConfig
from router.frontdoor import slow_requests as keeper_module
from router.frontdoor.slow_requests import Ranking, SlowRequests

T0 = 1_800_000_000.0
"""An epoch second at the start of a slice (600 s window, 60 s slices)."""


@pytest.fixture
def keeper() -> Iterator[SlowRequests]:
    yield SlowRequests(capacity=3, window_s=600.0, num_slices=10)


def ns(t: float) -> int:
    return int(t * 1e9)


def request(
    tracing: Tracing,
    at: float,
    e2e_s: float,
    ttft_s: float | None,
    name: str = "r",
    parent: trace.Span | None = None,
) -> None:
    """One request as the door records it: a root with its figures, an attempt, a route and
    a prefill step under it, and a finish; it finishes at `at` + `e2e_s`."""
    tracer = tracing.tracer
    context = trace.set_span_in_context(parent) if parent is not None else None
    root = tracer.start_span(SpanName.REQUEST, context=context, start_time=ns(at))
    under_root = trace.set_span_in_context(root)
    attempt = tracer.start_span(SpanName.ATTEMPT, context=under_root, start_time=ns(at + 0.01))
    under_attempt = trace.set_span_in_context(attempt)
    route = tracer.start_span(SpanName.ROUTE, context=under_attempt, start_time=ns(at + 0.01))
    route.set_attribute("baton.route.cached_blocks", ["prefill-0=3", "decode-0=1"])
    route.end(end_time=ns(at + 0.02))
    step = tracer.start_span(
        SpanName.PREFILL,
        context=under_attempt,
        start_time=ns(at + 0.02),
        attributes={"baton.worker": "prefill-0", "baton.kv.bytes": 4096},
    )
    step.end(end_time=ns(at + 0.02 + e2e_s / 2))
    attempt.end(end_time=ns(at + e2e_s - 0.01))
    finish = tracer.start_span(SpanName.FINISH, context=under_root, start_time=ns(at + e2e_s))
    finish.end(end_time=ns(at + e2e_s))
    figures: dict[str, str | float] = {"baton.e2e_s": e2e_s, "baton.request_id": name}
    if ttft_s is not None:
        figures["baton.ttft_s"] = ttft_s
    root.set_attributes(figures)
    root.end(end_time=ns(at + e2e_s))


def ids(keeper: SlowRequests, ranking: Ranking, now: float) -> list[str]:
    return [r.request_id for r in keeper.slowest(ranking, now)]


def test_keeps_the_slowest_by_each_ranking(keeper: SlowRequests) -> None:
    tracing = Tracing(TracingConfig(), "door", keeper)
    figures = {"a": (1.0, 0.1), "b": (5.0, 0.2), "c": (2.0, 0.9), "d": (3.0, None),
               "e": (0.5, 0.5), "f": (4.0, 0.05)}  # fmt: skip
    for i, (name, (e2e, ttft)) in enumerate(figures.items()):
        request(tracing, T0 + i, e2e, ttft, name)
    now = T0 + 30
    assert ids(keeper, Ranking.E2E, now) == ["b", "f", "d"]
    assert ids(keeper, Ranking.TTFT, now) == ["c", "e", "b"]  # d sent no token: not ranked


def test_a_timeline_holds_its_own_spans_with_offsets(keeper: SlowRequests) -> None:
    tracing = Tracing(TracingConfig(), "door", keeper)
    caller = tracing.tracer.start_span("caller", start_time=ns(T0))
    request(tracing, T0, 2.0, 0.5, "first", parent=caller)
    request(tracing, T0 + 1, 1.0, 0.5, "second", parent=caller)  # the same trace id
    (first, second) = keeper.slowest(Ranking.E2E, T0 + 10)
    assert (first.request_id, second.request_id) == ("first", "second")
    assert first.trace_id == second.trace_id == ""  # nothing exported: no trace to name
    for kept in (first, second):
        names = [s.name for s in kept.spans]
        assert names == [SpanName.REQUEST, SpanName.ATTEMPT, SpanName.ROUTE, SpanName.PREFILL,
                         SpanName.FINISH]  # fmt: skip
    spans = {s.name: s for s in first.spans}
    assert spans[SpanName.REQUEST].duration_s == 2.0
    assert [spans[n].depth for n in (SpanName.ATTEMPT, SpanName.ROUTE, SpanName.FINISH)] == [
        1,
        2,
        1,
    ]
    prefill = spans[SpanName.PREFILL]
    assert prefill.start_s == pytest.approx(0.02) and prefill.duration_s == pytest.approx(1.0)
    assert prefill.worker == "prefill-0" and prefill.attributes["baton.kv.bytes"] == 4096
    assert (
        spans[SpanName.ROUTE].attributes["baton.route.cached_blocks"] == "prefill-0=3, decode-0=1"
    )
    assert keeper._num_pending == 0  # nothing left waiting


def test_forgets_what_leaves_the_window(keeper: SlowRequests) -> None:
    tracing = Tracing(TracingConfig(), "door", keeper)
    request(tracing, T0, 9.0, 9.0, "old and slow")
    request(tracing, T0 + 300, 1.0, 0.1, "recent")
    assert ids(keeper, Ranking.E2E, T0 + 310) == ["old and slow", "recent"]
    assert ids(keeper, Ranking.E2E, T0 + 610) == ["recent"]  # its slice left the window
    request(tracing, T0 + 700, 2.0, 0.2, "new")
    assert ids(keeper, Ranking.E2E, T0 + 702) == ["new", "recent"]
    assert ids(keeper, Ranking.E2E, T0 + 2000) == []


def test_the_window_is_exact_across_slices(keeper: SlowRequests) -> None:
    """Each slice keeps its own top 3: the window's top 3 is found wherever its members are,
    including a slice whose other requests were all faster than another slice's."""
    tracing = Tracing(TracingConfig(), "door", keeper)
    for i, e2e in enumerate([1.0, 1.1, 1.2, 1.3]):  # slice 0
        request(tracing, T0 + i, e2e, None, f"s0-{e2e}")
    for i, e2e in enumerate([5.0, 0.1]):  # slice 2
        request(tracing, T0 + 120 + i, e2e, None, f"s2-{e2e}")
    assert ids(keeper, Ranking.E2E, T0 + 130) == ["s2-5.0", "s0-1.3", "s0-1.2"]


def test_memory_is_bounded(keeper: SlowRequests, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper_module, "MAX_PENDING_SPANS", 50)
    tracing = Tracing(TracingConfig(), "door", keeper)
    for i in range(2000):  # 2000 requests over the window and past it
        request(tracing, T0 + i, 0.1 + (i % 7) / 10, 0.05, f"r{i}")
    # At most num_slices x 2 rankings x capacity requests are held.
    assert keeper.num_held() <= 10 * 2 * 3
    # Spans whose root never ends (a request that hangs) wait, up to the bound.
    tracer = tracing.tracer
    for _ in range(200):
        root = tracer.start_span(SpanName.REQUEST)
        tracer.start_span(SpanName.ROUTE, context=trace.set_span_in_context(root)).end()
    assert keeper._num_pending <= 50


def test_with_export_on_every_request_is_kept_but_only_the_sampled_share_exported(
    keeper: SlowRequests,
) -> None:
    """Ratio 0: nothing is sampled for the collector, and the keeper still sees everything
    (the exporter's endpoint is never reached: no span is sampled)."""
    tracing = Tracing(TracingConfig("127.0.0.1:9", 0.0), "door", keeper)
    try:
        request(tracing, T0, 1.0, 0.5, "unsampled")
        root = tracing.tracer.start_span(SpanName.REQUEST)
        assert root.is_recording() and not root.get_span_context().trace_flags.sampled
        assert ids(keeper, Ranking.E2E, T0 + 5) == ["unsampled"]
    finally:
        tracing.shutdown()


def test_off_is_the_noop_tracer() -> None:
    tracing = Tracing(TracingConfig(), "door")
    assert not tracing.enabled and not tracing.tracer.start_span("x").is_recording()


def test_report_is_plain_json(keeper: SlowRequests) -> None:
    import json

    tracing = Tracing(TracingConfig(), "door", keeper)
    request(tracing, T0, 1.0, 0.25, "r")
    report = json.loads(json.dumps(keeper.report(now=T0 + 5)))
    assert report["capacity"] == 3 and report["window_s"] == 600.0
    (kept,) = report["ttft"]
    assert kept["ttft_s"] == 0.25 and kept["spans"][0]["name"] == SpanName.REQUEST
    assert report["e2e"][0]["request_id"] == "r"
