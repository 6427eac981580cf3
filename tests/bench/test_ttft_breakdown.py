"""bench/planning/ttft_breakdown.py: the spans of each sampled request placed on its own
timeline (offsets from its door's root span), medians over the requests; traces from before
the first sample left out."""

from __future__ import annotations

from bench.planning.ttft_breakdown import breakdown, table
from tests.support.otlp_receiver import ReceivedSpan

MS = 1_000_000


def span(trace: str, service: str, name: str, start_ms: float, end_ms: float) -> ReceivedSpan:
    base = 10_000 * MS
    return ReceivedSpan(trace, name, "", name, base + int(start_ms * MS), base + int(end_ms * MS),
                        service, {}, (), 0)  # fmt: skip


def test_spans_are_placed_from_their_own_root() -> None:
    spans = [
        span("old", "baton-router", "baton.request", -50, -40),  # before the samples: out
        span("a", "baton-router", "baton.request", 0, 12),
        span("a", "baton-unified", "prefill", 3, 4),
        span("a", "baton-router", "first_token", 5, 10),
        span("b", "baton-router", "baton.request", 100, 110),
        span("b", "baton-unified", "prefill", 105, 105.5),
    ]
    samples = [
        {"sent_ns": 10_000 * MS - MS, "ttft_s": 0.012, "engine_s": 0.004},
        {"sent_ns": 10_000 * MS + 99 * MS, "ttft_s": 0.010, "engine_s": 0.005},
    ]
    result = breakdown(samples, spans)
    assert result["requests"] == 2 and result["ttft_p50_ms"] == 11.0
    assert result["outside_engine_p50_ms"] == 6.5  # (8 + 5) / 2
    rows = {(r["service"], r["span"]): r for r in result["spans"]}
    assert rows[("baton-router", "baton.request")]["n"] == 2
    prefill = rows[("baton-unified", "prefill")]
    assert prefill["start_ms"] == 4.0 and prefill["duration_ms"] == 0.75
    assert "outside the engine 6.50 ms" in table(result)
    # Sent 1 ms before their roots; a's first token reached the client 1 ms after the door's
    # first-token span ended (b has none).
    assert result["client_to_door_p50_ms"] == 1.0
    assert result["first_token_to_client_p50_ms"] == 1.0
    assert "to the client's: 1.00 ms" in table(result)
