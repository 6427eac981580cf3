"""The serving work's CPU measured on a live server (bench/planning/host_cpu.py), and the
validation's plans with and without the host (bench/planning/plan_validate.py), with the
answers worked by hand."""

from __future__ import annotations

import pytest

from bench.planning import host_cpu
from bench.planning import plan_validate as pv
from core.perf import DecodeProfile, WorkerProfile
from planner.sim.host import HostCPU


def test_host_busy_seconds_come_from_the_cpu_line() -> None:
    stat = "cpu  100 20 30 4000 50 6 7 80 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert host_cpu.host_busy_s(stat) == pytest.approx((100 + 20 + 30 + 6 + 7) / 100)
    with pytest.raises(ValueError, match="cpu line"):
        host_cpu.host_busy_s("intr 1 2 3\n")


def test_serving_costs_are_solved_phase_by_phase() -> None:
    phases = {
        "idle": {"serving_s": 1.0, "wall_s": 10.0, "requests": 0, "tokens": 0},
        # 0.1 cores a second for 2 s, then 40 requests of 5 ms
        "requests": {"serving_s": 0.2 + 0.2, "wall_s": 2.0, "requests": 40, "tokens": 40},
        # 0.1 x 10 s, 40 requests, 2,000 tokens of 0.5 ms
        "tokens": {"serving_s": 1.0 + 0.2 + 1.0, "wall_s": 10.0, "requests": 40, "tokens": 2000},
    }
    out = host_cpu.solve(phases)
    assert out["base_cores"] == pytest.approx(0.1)
    assert out["request_ms"] == pytest.approx(5.0)
    assert out["token_ms"] == pytest.approx(0.5)


def test_the_share_is_what_explains_a_lone_engines_slower_steps() -> None:
    decode = DecodeProfile(step_ms=10.0, row_ms=1.0, ctx_ms=0.0)
    prefill = WorkerProfile(step_ms=10.0, token_ms=0.0, chunk_tokens=4096)
    # 100 steps of 8 rows priced 18 ms each = 1.8 s; served 2.25 s (1.25x) beside 0.4 cores
    decoded = {"busy_s": 2.25, "steps": 100, "decode_rows": 800}
    phase = {"wall_s": 10.0, "serving_s": 4.0, "workers": {"decode-1": decoded}}
    share = host_cpu.engine_share(phase, decode, prefill, prompt_tokens=32, tokens=64)
    assert share == pytest.approx(0.5)  # 1 / (1 - 0.5 x 0.4) = 1.25
    assert HostCPU(2, 0.4, engine_share=share).stretch(0.0, 1) == pytest.approx(1.25)


def test_co_run_is_the_slowdown_the_serving_work_does_not_explain() -> None:
    costs = {"base_cores": 0.2, "request_ms": 0.0, "token_ms": 1.0}

    def phase(prefill_ms: list[float], rows: float) -> dict:
        workers = {
            "prefill-0": {"busy_s": sum(prefill_ms) / 1000},
            "decode-1": {"decode_rows": rows},
        }
        return {"wall_s": 10.0, "requests": 4, "workers": workers, "prefill_ms": prefill_ms}

    # alone: 0.2 cores of serving, share 0.5 -> 1/0.9; beside: 0.2 + 2,000 tokens of 1 ms in
    # 10 s = 0.4 cores, no core free -> 2/1.6; the prefills 1.3x slower beyond that
    beside_ms = 300 * 1.3 * (2 / 1.6) * 0.9
    alone = [phase([290, 300, 310], 0), phase([300], 0)]
    beside = [phase([beside_ms, beside_ms + 50], 2000), phase([beside_ms - 50], 2000)]
    assert host_cpu.co_run(alone, beside, costs, cores=2, share=0.5) == pytest.approx(0.3)
    no_pool = [{"wall_s": 1.0, "requests": 1, "workers": {}, "prefill_ms": []}]
    assert host_cpu.co_run(no_pool, no_pool, costs, cores=2, share=0.5) == 0.0


def test_validation_plans_with_and_without_the_host() -> None:
    flags = ["--prefill", "1", "--host-cpu", "2", "0.1", "5", "0.5", "0.6", "0.3", "--decode", "1"]
    assert pv.without(flags, flags[2:9]) == ["--prefill", "1", "--decode", "1"]
    assert pv.without(flags, ["--nothing"]) == flags
