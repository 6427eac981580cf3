"""The host's CPUs in `baton plan`'s model (planner/sim/host.py), with the answers worked by
hand (their measurement on a live server: tests/bench/test_host_cpu.py)."""

from __future__ import annotations

import argparse

import pytest

from core.perf import DecodeProfile, WorkerProfile
from loadgen.traces import TraceRequest
from planner import plan as baton_plan
from planner.sim.cluster import RequestOverhead, simulate_cluster
from planner.sim.host import HostCPU

PREFILL = WorkerProfile(step_ms=10.0, token_ms=1.0, chunk_tokens=4096, attn_ms=0.0)
DECODE = DecodeProfile(step_ms=5.0, row_ms=1.0, ctx_ms=0.0)


def req(t_ms: int, prompt: int, output: int) -> TraceRequest:
    ids = list(range(t_ms * 1000, t_ms * 1000 + prompt // 16))
    return TraceRequest(t_ms, prompt, output, ids)


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
    trace.sort(key=lambda r: r.arrival_ms)
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
