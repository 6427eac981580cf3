"""The bursty benchmark's load shape and its worker-seconds count (bench/serving/bursty.py)."""

from __future__ import annotations

import argparse
import itertools

import pytest

from bench.serving import bursty
from bench.serving.pools import worker_seconds


def test_phases_alternate_low_and_high_around_the_mean() -> None:
    times = bursty.bursty_arrivals(phases=20, mean_rate=2.0, burst=8.0, phase_s=50.0, seed=1)
    per_phase = [0] * 20
    for t in times:
        per_phase[int(t // 50.0)] += 1
    low, high = sum(per_phase[0::2]) / 10, sum(per_phase[1::2]) / 10
    assert low == pytest.approx(2 * 2.0 / 9 * 50, rel=0.2)  # 22 a low phase
    assert high == pytest.approx(16 * 2.0 / 9 * 50, rel=0.1)  # 178 a high phase
    assert len(times) / (20 * 50.0) == pytest.approx(2.0, rel=0.1)
    assert times == sorted(times) and times[-1] < 1000.0


def test_worker_seconds_integrate_the_sampled_pool_sizes() -> None:
    samples = [(0.0, {"decode": 2}), (10.0, {"decode": 4, "prefill": 1}), (15.0, {"decode": 2})]
    assert worker_seconds(samples, end_s=20.0) == {"decode": 2 * 10 + 4 * 5 + 2 * 5, "prefill": 5}
    assert worker_seconds(samples, end_s=12.0) == {"decode": 2 * 10 + 4 * 2, "prefill": 2}


def test_the_autoscaled_pools_range_from_the_average_to_the_peak() -> None:
    args = argparse.Namespace(average_pools=(1, 1), peak_pools=(2, 3), ttft_slo=2.0,
                              itl_slo=0.2, phase_s=40.0)  # fmt: skip
    auto = bursty.configs(args)["autoscaled"]
    flags = dict(itertools.pairwise(auto))
    assert "--autoscale" in auto
    assert (flags["--min-prefill"], flags["--max-prefill"]) == ("1", "2")
    assert (flags["--min-decode"], flags["--max-decode"]) == ("1", "3")
    assert bursty.configs(args)["static-peak"][:4] == ["--prefill", "2", "--decode", "3"]


def test_slo_attainment_is_counted_by_the_phase_a_request_was_sent_in() -> None:
    from loadgen.metrics import SLO, RequestResult

    def sent(at: float, ttft: float) -> RequestResult:
        return RequestResult(at, 10, ok=True, ttft_s=ttft, e2e_s=ttft + 0.1, num_output_tokens=2)

    results = [sent(1, 0.5), sent(12, 0.5), sent(15, 3.0), sent(19, 0.1), sent(45, 9.0)]
    slo = SLO(ttft_s=2.0, tpot_s=0.2)
    # Phase 3 (20-30 s) sent nothing; the late one (45 s) counts in the last phase.
    assert bursty.met_by_phase(results, slo, phases=4, phase_s=10.0) == [1.0, 2 / 3, None, 0.0]
