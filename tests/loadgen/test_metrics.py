"""Report arithmetic on synthetic timings: percentiles, TPOT, ITL, goodput, hit rate, the
KV-transfer share and the /metrics scrape."""

from __future__ import annotations

import pytest

from loadgen.metrics import (
    SLO,
    RequestResult,
    percentile,
    scrape_by_label,
    scrape_sum,
    summarize,
)


def _ok(ttft: float, gaps: list[float], prompt: int = 100, cached: int = 0) -> RequestResult:
    return RequestResult(
        sent_s=0.0, num_prompt_tokens=prompt, ok=True, ttft_s=ttft, e2e_s=ttft + sum(gaps),
        itl_s=list(gaps), num_output_tokens=len(gaps) + 1, num_cached_tokens=cached,
    )  # fmt: skip


def test_percentile_interpolates_between_ranks() -> None:
    xs = [float(x) for x in range(1, 101)]  # 1..100
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 100.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)  # order does not matter
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_tpot_is_the_mean_pace_after_the_first_token() -> None:
    r = _ok(0.5, [0.1, 0.2, 0.3])
    assert r.tpot_s == pytest.approx(0.2)
    assert _ok(0.5, []).tpot_s is None  # one token: no pace
    assert RequestResult(0.0, 5, ok=False, error="x").tpot_s is None


def test_summary_of_synthetic_timings() -> None:
    results = [
        _ok(0.2, [0.05] * 9, prompt=100, cached=50),  # meets both targets
        _ok(0.3, [0.05, 0.45], prompt=100, cached=0),  # TPOT 0.25: misses
        _ok(3.0, [0.05] * 4, prompt=200, cached=100),  # TTFT misses
        RequestResult(0.0, 100, error="HTTP 503: overloaded"),
    ]
    s = summarize(results, duration_s=2.0, slo=SLO(ttft_s=1.0, tpot_s=0.1), kv_transfer_s=0.35)
    assert (s["num_requests"], s["num_ok"], s["num_errors"]) == (4, 3, 1)
    assert s["errors"] == {"HTTP 503: overloaded": 1}
    assert s["goodput"] == pytest.approx(0.5)  # 1 good request / 2 s
    assert s["slo_attainment"] == pytest.approx(0.25)
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_tokens"] == 10 + 3 + 5
    assert s["output_tokens_per_s"] == pytest.approx(9.0)
    assert s["prefix_hit_rate"] == pytest.approx(150 / 400)  # failed requests excluded
    assert s["ttft_s"]["mean"] == pytest.approx(3.5 / 3)
    assert s["ttft_s"]["p50"] == pytest.approx(0.3)
    # ITL pools every gap: 9 + 2 + 4 gaps.
    gaps = sorted([0.05] * 9 + [0.05, 0.45] + [0.05] * 4)
    assert s["itl_s"]["p50"] == pytest.approx(0.05)
    assert s["itl_s"]["p99"] == pytest.approx(percentile(gaps, 99))
    assert s["tpot_s"]["p50"] == pytest.approx(0.05)
    assert s["e2e_s"]["p99"] == pytest.approx(percentile([0.65, 0.8, 3.2], 99))
    assert s["kv_transfer_share_of_ttft"] == pytest.approx(0.35 / 3.5)


def test_a_run_with_no_successes_still_summarises() -> None:
    s = summarize([RequestResult(0.0, 10, error="boom")], 1.0, SLO(1.0, 0.1), None)
    assert s["goodput"] == 0 and s["ttft_s"]["p99"] is None and s["prefix_hit_rate"] is None
    with pytest.raises(ValueError):
        summarize([], 0.0, SLO(1.0, 0.1))


def test_scrape_sum_reads_one_series_across_labels() -> None:
    text = (
        "# HELP baton:kv_transfer_seconds Duration of one request's KV transfer.\n"
        "# TYPE baton:kv_transfer_seconds histogram\n"
        'baton:kv_transfer_seconds_bucket{le="0.1"} 3.0\n'
        "baton:kv_transfer_seconds_sum 1.25\n"
        "baton:kv_transfer_seconds_count 4.0\n"
        'baton:requests_total{outcome="success"} 7.0\n'
        'baton:requests_total{outcome="failed"} 2.0\n'
    )
    assert scrape_sum(text, "baton:kv_transfer_seconds_sum") == pytest.approx(1.25)
    assert scrape_sum(text, "baton:requests_total") == pytest.approx(9.0)
    assert scrape_sum(text, "baton:kv_transfer_seconds") == 0.0  # exact names only


def test_scrape_by_label_reads_a_per_worker_gauge() -> None:
    text = (
        'baton:prefix_cache_hit_rate{worker="prefill-0"} 0.75\n'
        'baton:prefix_cache_hit_rate{worker="decode-2"} 0.5\n'
        'baton:kv_cache_usage_perc{worker="prefill-0"} 0.1\n'
    )
    assert scrape_by_label(text, "baton:prefix_cache_hit_rate", "worker") == {
        "prefill-0": 0.75,
        "decode-2": 0.5,
    }
