"""The host's CPUs in `baton plan`'s model (bench/plan_host.py) and their measurement on a
live server (bench/host_cpu.py), with the answers worked by hand."""

from __future__ import annotations

import argparse

import pytest

from bench import host_cpu
from bench import plan as baton_plan
from bench import plan_validate as pv
from bench.plan_host import HostCPU
from bench.plan_sim import RequestOverhead, simulate_cluster
from core.perf import DecodeProfile, WorkerProfile

PREFILL = WorkerProfile(step_ms=10.0, token_ms=1.0, chunk_tokens=4096, attn_ms=0.0)
DECODE = DecodeProfile(step_ms=5.0, row_ms=1.0, ctx_ms=0.0)


def req(t_ms: int, prompt: int, output: int) -> dict:
    ids = list(range(t_ms * 1000, t_ms * 1000 + prompt // 16))
    return {"timestamp": t_ms, "input_length": prompt, "output_length": output, "hash_ids": ids}


def test_an_engine_with_a_free_core_beside_it_runs_as_profiled() -> None:
    host = HostCPU(cores=2, base_cores=0.5)
    assert host.stretch(0.0, busy_workers=1) == 1.0  # 1 engine + 0.5 of serving on 2 cores
    assert host.stretch(0.0, busy_workers=0) == 1.0


def test_serving_work_past_the_free_cores_comes_out_of_the_engines() -> None:
    host = HostCPU(cores=2, base_cores=0.1, token_ms=1.0, window_ms=1000.0)
    host.tokens(500.0, 400)  # 400 ms of CPU in the last second: 0.4 cores
    # two engines + 0.5 cores of serving on 2 cores: the engines keep 1.5 of their 2
    assert host.stretch(900.0, busy_workers=2) == pytest.approx(2 / 1.5)
    # a second later those tokens are out of the window: only the base is left
    assert host.stretch(1600.0, busy_workers=2) == pytest.approx(2 / 1.9)


def test_a_worker_of_several_threads_is_that_many_engines() -> None:
    host = HostCPU(cores=4, base_cores=1.0, threads_per_worker=2)
    assert host.stretch(0.0, busy_workers=1) == 1.0
    assert host.stretch(0.0, busy_workers=2) == pytest.approx(4 / 3)


def test_a_saturated_host_slows_the_engines_but_never_stops_them() -> None:
    host = HostCPU(cores=1, base_cores=5.0)
    assert host.stretch(0.0, busy_workers=1) == pytest.approx(10.0)


def test_serving_work_woken_on_an_engine_core_slows_it_though_a_core_is_free() -> None:
    host = HostCPU(cores=2, base_cores=0.4, engine_share=0.5)
    assert host.stretch(0.0, busy_workers=1) == pytest.approx(1 / (1 - 0.2))
    # no core free: all of it comes out of the engines, whatever the share
    assert host.stretch(0.0, busy_workers=2) == pytest.approx(2 / 1.6)


def test_an_engine_beside_another_steps_slower_for_the_shared_host() -> None:
    host = HostCPU(cores=4, co_run=0.3)
    assert host.stretch(0.0, busy_workers=1) == 1.0
    assert host.stretch(0.0, busy_workers=2) == pytest.approx(1.3)
    assert host.stretch(0.0, busy_workers=3) == pytest.approx(1.6)
    # more engines than cores: only those on other cores run beside it; the rest slice
    assert HostCPU(cores=2, co_run=0.3).stretch(0.0, busy_workers=3) == pytest.approx(1.3 * 1.5)


def test_bad_hosts_are_refused() -> None:
    with pytest.raises(ValueError, match="usable host"):
        HostCPU(cores=0)
    with pytest.raises(ValueError, match=">= 0"):
        HostCPU(cores=2, token_ms=-1)
    with pytest.raises(ValueError, match="engine_share"):
        HostCPU(cores=2, engine_share=1.5)
    with pytest.raises(ValueError, match="co_run"):
        HostCPU(cores=2, co_run=-0.1)


def test_a_host_with_room_to_spare_changes_nothing() -> None:
    trace = [req(t, 160, 16) for t in range(0, 400, 40)] + [req(50, 32, 8)]
    trace.sort(key=lambda r: r["timestamp"])
    kw = {"overhead": RequestOverhead(3.0, 7.0), "disagg_min_uncached_tokens": 64}
    plain = simulate_cluster(trace, PREFILL, DECODE, 1, 1, **kw)
    roomy = simulate_cluster(trace, PREFILL, DECODE, 1, 1, host=HostCPU(cores=8), **kw)
    assert roomy == plain


def test_when_the_cores_are_taken_steps_and_first_token_overheads_stretch() -> None:
    """One prefill and one decode worker on 2 cores, the serving work 0.5 cores at all
    times: while both engines step, each step takes 2 / 1.5 of its profile."""
    trace = [req(0, 160, 4)]
    host = HostCPU(cores=2, base_cores=0.5)
    (plain,) = simulate_cluster(trace, PREFILL, DECODE, 1, 1, overhead=RequestOverhead(0, 6))
    (hosted,) = simulate_cluster(
        trace, PREFILL, DECODE, 1, 1, overhead=RequestOverhead(0, 6), host=host
    )
    # alone on the host (the decode worker idle) the prefill has a core to spare: as profiled;
    # so do the decode steps after it (the prefill worker idle by then)
    assert hosted == plain
    busy = HostCPU(cores=2, base_cores=1.5)  # now one engine alone overflows: 1 + 1.5 > 2
    (slow,) = simulate_cluster(
        trace, PREFILL, DECODE, 1, 1, overhead=RequestOverhead(0, 6), host=busy
    )
    stretch = 1 / (1 - 0.5)
    assert slow["ttft_ms"] == pytest.approx((10 + 160) * stretch + 6 * stretch)
    assert slow["itl_ms"] == pytest.approx(6.0 * stretch)


def test_decode_tokens_are_serving_work_that_slows_the_other_engine() -> None:
    """A long decode on one worker while the prefill worker computes: the decode's tokens
    count against the host, so the prefill started after them runs slower."""
    host = HostCPU(cores=2, base_cores=0.0, token_ms=2.0)
    long_decode = req(0, 160, 400)
    later = req(2000, 1600, 2)
    plain = simulate_cluster([long_decode, later], PREFILL, DECODE, 1, 1)
    hosted = simulate_cluster([long_decode, later], PREFILL, DECODE, 1, 1, host=host)
    # 1 row a 6 ms step, 2 ms of CPU a token: 0.33 cores of serving beside two engines
    assert hosted[1]["ttft_ms"] > plain[1]["ttft_ms"] * 1.1
    assert hosted[0]["ttft_ms"] == plain[0]["ttft_ms"]  # before the prefill, one engine


def test_plan_takes_the_host_from_its_flags(tmp_path) -> None:
    import json

    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({
        "step_ms": 10.0, "token_ms": 1.0, "chunk_tokens": 512, "attn_ms": 0.0,
        "decode": {"decode_step_ms": 5.0, "decode_row_ms": 1.0, "decode_ctx_ms": 0.0},
    }))  # fmt: skip
    common = ["--profile", str(profile), "--prefill", "1", "--decode", "1", "--workload",
              "fixed", "--input-len", "512", "--output-len", "32", "--rate", "20",
              "--num-requests", "40", "--duration", "10"]  # fmt: skip

    def pick(*extra: str) -> dict:
        p = baton_plan.build_arg_parser(argparse.ArgumentParser())
        return baton_plan.plan(p.parse_args([*common, *extra]))["pick"]

    free = pick()
    crowded = pick("--host-cpu", "2", "0.2", "5", "1.0", "0.5", "0.3")
    assert crowded["itl_p50_ms"] > free["itl_p50_ms"]
    assert pick("--host-cpu", "64", "0", "0", "0", "0", "0") == free


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
