"""`baton plan`'s cluster model (planner/sim/cluster.py) on traces whose answers are known by hand,
and the plan it picks (planner/plan.py)."""

from __future__ import annotations

import argparse
import json

import pytest

from core.perf import DecodeProfile, WorkerProfile
from loadgen.traces import TraceRequest
from planner import plan as baton_plan
from planner.sim.cluster import DecodeSim, RequestOverhead, simulate_cluster, summarize

PREFILL = WorkerProfile(step_ms=10.0, token_ms=1.0, chunk_tokens=4096, attn_ms=0.0)
DECODE = DecodeProfile(step_ms=5.0, row_ms=1.0, ctx_ms=0.0)


def req(t_ms: int, prompt: int, output: int, ids: list[int] | None = None) -> TraceRequest:
    """A trace request; its blocks are its own unless `ids` says otherwise."""
    if ids is None:
        ids = list(range(t_ms * 1000, t_ms * 1000 + prompt // 16))
    return TraceRequest(t_ms, prompt, output, ids)


def test_one_request_waits_for_nothing() -> None:
    (r,) = simulate_cluster([req(0, 160, 4)], PREFILL, DECODE, 1, 1)
    assert r["ttft_ms"] == pytest.approx(10 + 160)  # one step + 160 tokens
    # Three decode steps of one row (6 ms each) after the prefill's token.
    assert r["itl_ms"] == pytest.approx(6.0)
    assert r["e2e_ms"] == pytest.approx(170 + 18)


def test_prefills_queue_first_in_first_out_and_a_cached_prefix_is_skipped() -> None:
    shared = list(range(10))
    a, b = simulate_cluster([req(0, 160, 1, shared), req(0, 160, 1, shared)], PREFILL, DECODE, 1, 1)
    assert a["ttft_ms"] == pytest.approx(170)
    # b waits for a, then finds its 160 tokens cached (one step for the last token's logits
    # is all the profile charges: 0 uncached tokens).
    assert b["ttft_ms"] == pytest.approx(170 + 10)


def test_decode_batches_the_requests_it_holds() -> None:
    d = DecodeSim(DECODE, max_seqs=8, kv_tokens=10_000, prefill=PREFILL)
    d.add(0.0, 0, prompt=10, left=2)
    d.add(0.0, 1, prompt=10, left=2)
    d.run_until(float("inf"))
    assert d.finished == {0: [7.0, 7.0], 1: [7.0, 7.0]}  # 5 + 2 rows per step


def test_a_full_decode_worker_makes_the_next_request_wait() -> None:
    d = DecodeSim(DECODE, max_seqs=1, kv_tokens=10_000, prefill=PREFILL)
    d.add(0.0, 0, prompt=10, left=2)
    d.add(0.0, 1, prompt=10, left=1)
    d.run_until(float("inf"))
    assert d.finished[0] == [6.0, 6.0]
    # It joins when request 0 leaves at 12 ms: its first token (the prefill's) shows then.
    assert d.first_token_ms[1] == 12.0 and d.finished[1] == [6.0]


def test_a_short_prompt_is_prefilled_by_its_decode_worker() -> None:
    (r,) = simulate_cluster([req(0, 160, 4)], PREFILL, DECODE, 1, 1, disagg_min_uncached_tokens=256)
    assert r["on_decode"]
    assert r["ttft_ms"] == pytest.approx(10 + 160)  # the prefill fit, on the decode worker
    assert r["itl_ms"] == pytest.approx(6.0)


def test_the_serving_overhead_of_each_path_lands_on_its_first_tokens() -> None:
    """Measured apart (bench/planning/request_overhead.py): a constant per path on the first
    token, nothing moved in the queues or the later tokens."""
    trace = [req(0, 160, 4), req(1000, 480, 4), req(2000, 480, 1)]
    plain = simulate_cluster(trace, PREFILL, DECODE, 1, 1, disagg_min_uncached_tokens=256)
    over = simulate_cluster(trace, PREFILL, DECODE, 1, 1, disagg_min_uncached_tokens=256,
                            overhead=RequestOverhead(local_ms=15.0, disagg_ms=30.0))  # fmt: skip
    assert [r["on_decode"] for r in over] == [True, False, False]
    for p, o, extra in zip(plain, over, (15.0, 30.0, 30.0), strict=True):
        assert o["ttft_ms"] == pytest.approx(p["ttft_ms"] + extra)
        assert o["itl_ms"] == p["itl_ms"]
        assert o["e2e_ms"] == pytest.approx(p["e2e_ms"] + extra)


def test_a_prefill_runs_while_its_decode_worker_reserves_between_two_steps() -> None:
    """B arrives 1 ms into the decode worker's 170 ms step (A's prefill there): its prefill
    runs at once, 1 -> 491 ms, while its blocks are reserved when that step ends (170 ms);
    its KV goes when both are done, and the decode worker admits it at its next step
    boundary (A's 6 ms steps from 170: 494 ms)."""
    a, b = simulate_cluster([req(0, 160, 1000), req(1, 480, 4)], PREFILL, DECODE, 1, 1,
                            disagg_min_uncached_tokens=256)  # fmt: skip
    assert a["on_decode"] and not b["on_decode"]
    assert b["ttft_ms"] == pytest.approx(494 - 1)


def test_the_decode_worker_prefills_only_what_it_does_not_hold() -> None:
    prefix = list(range(20))  # 320 tokens
    a, b = simulate_cluster(
        [req(0, 352, 2, prefix + [100, 101]), req(1000, 352, 2, prefix + [200, 201])],
        PREFILL, DECODE, 1, 1, disagg_min_uncached_tokens=256,
    )  # fmt: skip
    # a: 352 uncached tokens on the decode worker, so the prefill pool; once its KV lands
    # there its blocks are in the decode worker's cache too.
    assert not a["on_decode"] and a["ttft_ms"] == pytest.approx(10 + 352)
    # b: only its own 32 tokens are not held there: prefilled on the decode worker.
    assert b["on_decode"] and b["ttft_ms"] == pytest.approx(10 + 32)


def test_a_prefix_on_its_way_to_the_decode_worker_is_not_there_yet() -> None:
    prefix = list(range(20))
    _, b = simulate_cluster(
        [req(0, 352, 2, prefix + [100, 101]), req(100, 352, 2, prefix + [200, 201])],
        PREFILL, DECODE, 1, 1, disagg_min_uncached_tokens=256,
    )  # fmt: skip
    # b comes while a's KV is still being computed: the decode worker names a's blocks only
    # once they land, so b goes to the prefill worker, which holds them (a is its last
    # request), and waits there for a: 32 tokens after a's 362 ms.
    assert not b["on_decode"] and b["ttft_ms"] == pytest.approx(362 + 10 + 32 - 100)


def test_a_prompt_prefilled_on_the_decode_worker_stalls_its_running_rows() -> None:
    d = DecodeSim(DECODE, max_seqs=8, kv_tokens=10_000, prefill=PREFILL)
    d.add(0.0, 0, prompt=10, left=3)
    d.add_prefill(0.0, 1, prompt=50, cached=0, left=1)
    d.run_until(float("inf"))
    # Step 1: request 0's row (decode fit: 5 + 1) with request 1's 50-token chunk (+ 50: no
    # second fixed cost): 56 ms, its first token.
    assert d.first_token_ms[1] == 56.0
    assert d.finished[0] == [56.0, 7.0, 6.0]  # then two rows (5 + 2), then one (5 + 1)
    assert d.finished[1] == [7.0]


def test_prompt_chunks_on_a_decode_worker_share_the_step_budget() -> None:
    small = WorkerProfile(step_ms=10.0, token_ms=1.0, chunk_tokens=64, attn_ms=0.0)
    d = DecodeSim(DECODE, max_seqs=8, kv_tokens=10_000, prefill=small)
    d.add(0.0, 0, prompt=10, left=2)
    d.add_prefill(0.0, 1, prompt=100, cached=0, left=1)
    d.run_until(float("inf"))
    # 64 tokens a step: request 0's row, then 63 prompt tokens; the other 37 the next step.
    assert d.finished[0] == [pytest.approx(6 + 63), pytest.approx(6 + 37)]
    assert d.first_token_ms[1] == pytest.approx(69 + 43)


def test_more_workers_help_the_phase_that_is_short() -> None:
    trace = [req(i * 20, 320, 40) for i in range(200)]  # prefill 330 ms every 20 ms: saturated
    one = summarize(simulate_cluster(trace, PREFILL, DECODE, 1, 1), 2000, 100)
    four = summarize(simulate_cluster(trace, PREFILL, DECODE, 4, 1), 2000, 100)
    assert four["ttft_p99_ms"] < one["ttft_p99_ms"] / 3
    assert four["goodput"] > one["goodput"]


def test_benchmark_requests_become_a_trace_with_shared_prefixes() -> None:
    system = list(range(16, 48))
    requests = [
        TraceRequest.of_prompt(0.0, system + [100] * 16, 8),
        TraceRequest.of_prompt(0.5, system + [200] * 16, 8),
        TraceRequest.of_prompt(9.0, [300] * 48, 8),
    ]
    trace = baton_plan.trace_of(requests, duration_s=5.0)
    assert [r.arrival_ms for r in trace] == [0, 500]  # the third comes after --duration
    a, b = (r.hash_ids for r in trace)
    assert a[:2] == b[:2] and a[2] != b[2]


def test_plan_picks_the_smallest_split_that_meets_the_targets(tmp_path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({
        "step_ms": 10.0, "token_ms": 1.0, "chunk_tokens": 4096,
        "decode": {"decode_step_ms": 5.0, "decode_row_ms": 1.0, "decode_ctx_ms": 0.0},
    }))  # fmt: skip
    parser = baton_plan.build_arg_parser(argparse.ArgumentParser())
    args = parser.parse_args([
        "--profile", str(profile), "--workers", "4", "--workload", "fixed", "--input-len", "256",
        "--output-len", "16", "--rate", "6", "--num-requests", "120", "--ttft-slo", "1",
        "--tpot-slo", "0.05",
    ])  # fmt: skip
    result = baton_plan.plan(args)
    # Every split of 4 workers, an empty prefill pool included: 4 + 3 + 2 + 1.
    assert len(result["runs"]) == 10
    assert sum(1 for r in result["runs"] if r["prefill"] == 0) == 4
    pick = result["pick"]
    best = max(r["goodput"] for r in result["runs"])
    assert pick["goodput"] >= best - 0.01
    # ~270 ms of prefill per request at 6 req/s needs two prefill workers at least.
    assert pick["prefill"] >= 2 and pick["prefill"] + pick["decode"] <= 4


def test_a_measured_transfer_feeds_the_plan(tmp_path) -> None:
    from core.perf import WorkerProfile

    fields = {"step_ms": 10.0, "token_ms": 1.0, "chunk_tokens": 4096,
              "decode": {"decode_step_ms": 5.0, "decode_row_ms": 1.0, "decode_ctx_ms": 0.0},
              "kv_bytes_per_token": 100_000}  # fmt: skip
    # As `baton profile` writes a measured transfer (planner/profile.py transfer_fields).
    measured = {"transfer_gbps": 0.05, "transfer_latency_ms": 40.0,
                "transfer_source": "measured over shm on h"}  # fmt: skip
    results = {}
    for name, extra in (("none", {}), ("measured", measured)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**fields, **extra}))
        args = baton_plan.build_arg_parser(argparse.ArgumentParser()).parse_args([
            "--profile", str(path), "--prefill", "1", "--decode", "1", "--workload", "fixed",
            "--input-len", "256", "--output-len", "16", "--rate", "1", "--num-requests", "10",
        ])  # fmt: skip
        results[name] = baton_plan.plan(args)["runs"][0]
    loaded = WorkerProfile.load(tmp_path / "measured.json")
    assert loaded.can_transfer
    # 256 tokens x 100 kB at 0.05 GB/s: 512 ms after 40 ms of latency.
    assert loaded.transfer_ms(256) == pytest.approx(40.0 + 512.0)
    assert results["measured"]["ttft_p50_ms"] > results["none"]["ttft_p50_ms"] + 500


def test_an_empty_prefill_pool_prefills_every_prompt_on_the_decode_workers(tmp_path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({
        "step_ms": 10.0, "token_ms": 1.0, "chunk_tokens": 4096,
        "decode": {"decode_step_ms": 5.0, "decode_row_ms": 1.0, "decode_ctx_ms": 0.0},
    }))  # fmt: skip
    args = baton_plan.build_arg_parser(argparse.ArgumentParser()).parse_args([
        "--profile", str(profile), "--prefill", "0", "--decode", "2", "--workload", "fixed",
        "--input-len", "512", "--output-len", "8", "--rate", "1", "--num-requests", "10",
    ])  # fmt: skip
    (run,) = baton_plan.plan(args, keep_records=True)["runs"]
    assert (run["prefill"], run["decode"]) == (0, 2)
    assert all(r["on_decode"] for r in run["records"])
    assert sum(w["prefill_tokens"] for w in run["workers"].values()) == 10 * 512


def test_plan_weighs_each_tp_size_by_its_gpus(tmp_path, capsys) -> None:
    # A TP 2 worker prefills twice as fast but costs two of the 4 GPUs: 0 + 1, 0 + 2, 1 + 1.
    decode = {"decode_step_ms": 5.0, "decode_row_ms": 1.0, "decode_ctx_ms": 0.0}
    fields = {"chunk_tokens": 4096, "decode": decode}
    paths = []
    for tp, token_ms in ((1, 1.0), (2, 0.5)):
        path = tmp_path / f"p_tp{tp}.json"
        path.write_text(json.dumps({**fields, "tp": tp, "step_ms": 10.0, "token_ms": token_ms}))
        paths += ["--profile", str(path)]
    from router.cli.main import main

    argv = ["plan", *paths, "--workers", "4", "--workload", "fixed", "--input-len", "256",
            "--output-len", "16", "--rate", "2", "--num-requests", "40",
            "--out", str(tmp_path / "plan.json")]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((tmp_path / "plan.json").read_text())
    splits = {(r["tp"], r["prefill"], r["decode"]) for r in result["runs"]}
    assert {(2, 0, 1), (2, 0, 2), (2, 1, 1)} == {s for s in splits if s[0] == 2}
    assert len(splits) == 10 + 3 and all(tp * (p + d) <= 4 for tp, p, d in splits)
    table = capsys.readouterr().out
    assert "| 2.00 | 2 | 1 | 1 |" in table and "| 2.00 | 1 | 3 | 1 |" in table
