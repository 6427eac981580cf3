"""The router simulator: trace paths, the light-then-burst generator, the simulated worker's
queue, and the one table a run prints (on a small slice)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from bench.routing import router_sim
from core.perf import WorkerProfile
from loadgen.traces import (
    DEFAULT_TRACE,
    REPO,
    TraceRequest,
    light_then_burst,
    resolve_trace,
    shared_prefix,
    traces_dir,
    write_jsonl,
)
from planner.sim import prefill_pool as sim_run
from planner.sim.misses import MissLedger
from planner.sim.prefill import Queued, SimWorker
from planner.sim.prefill_pool import at_load

PROFILE = WorkerProfile(step_ms=10.0, token_ms=1.0, chunk_tokens=256, attn_ms=0.0)


def test_traces_resolve_beside_the_checkout_never_a_fixed_path(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("BATON_TRACES", raising=False)
    assert traces_dir() in (REPO.parent / "shared" / "traces", REPO / "shared" / "traces")
    assert DEFAULT_TRACE["mooncake"].relative_to(traces_dir()) == Path(
        "mooncake/synthetic_trace.jsonl"
    )
    monkeypatch.setenv("BATON_TRACES", str(tmp_path))
    assert traces_dir() == tmp_path
    # relative paths: the working directory first, then the repo root
    monkeypatch.chdir(tmp_path)
    assert resolve_trace("loadgen/traces.py") == REPO / "loadgen" / "traces.py"
    (tmp_path / "t.jsonl").write_text("")
    assert resolve_trace("t.jsonl") == Path("t.jsonl")
    assert resolve_trace("../shared/x.jsonl") == (REPO.parent / "shared" / "x.jsonl").resolve()


def test_light_then_burst_shape() -> None:
    trace = light_then_burst(
        num_prompts=10,
        light_requests=30,
        burst_requests=200,
        light_gap_ms=500,
        burst_rate_per_s=100,
    )
    light, burst = trace[:30], trace[30:]
    assert len({r.hash_ids[0] for r in trace}) == 1  # one shared header block
    assert len({tuple(r.hash_ids[:3]) for r in light[:10]}) == 10  # every prompt, early
    gaps = [b.arrival_ms - a.arrival_ms for a, b in itertools.pairwise(light)]
    assert set(gaps) == {500}
    span = burst[-1].arrival_ms - burst[0].arrival_ms
    assert span < 200 * 500 / 10  # the burst comes far faster than the light phase
    assert all(r.input_length >= 16 * len(r.hash_ids) for r in trace)


def test_sim_worker_queues_fifo_and_reports_like_an_engine() -> None:
    w = SimWorker("p0", capacity=4, profile=PROFILE)
    hit, _, events, _ = w.serve([1, 2, 3])
    assert hit == 0 and events[0].block_hashes == [1, 2, 3]
    assert w.enqueue(0.0, 300, 300) == 2 * 10 + 300  # two chunks of 256
    hit, _, events, _ = w.serve([1, 2, 5, 6])  # 5 blocks > capacity 4: LRU (3) is evicted
    assert hit == 2 and events[-1].block_hashes == [3]
    assert w.enqueue(100.0, 200, 100) == 320 + 10 + 100  # waits for the first
    load = w.load(200.0)
    assert load.num_waiting == 1 and load.num_running == 1
    assert load.num_waiting_tokens == 100 + 300 * 120 // 320  # the running one: what is left
    assert load.num_cached_prompt_tokens == 100
    # the running prefill finished one of its two steps: an engine's totals count it
    assert load.steps.prefill_tokens == 150 and load.steps.forward_s == 0.16
    assert w.load(1000.0).steps.prefill_tokens == 400  # both finished: in the step totals


def test_sim_worker_reports_its_attention_as_an_engine_times_it() -> None:
    """The profile's attention term goes into the totals apart, with the pairs it covered
    (the router splits the two: router.routing.step_rate)."""
    profile = WorkerProfile(step_ms=10.0, token_ms=1.0, chunk_tokens=256, attn_ms=2.0)
    w = SimWorker("p0", capacity=64, profile=profile)
    finish = w.enqueue(0.0, 300, 100)  # 100 new tokens after 200 cached
    attention_ms = 2.0 * 100 * (200 + 100 / 2) / 1000  # per thousand of its area
    assert finish == pytest.approx(10 + 100 + attention_ms)
    steps = w.load(finish).steps
    assert steps.prefill_pairs == 100 * 200 + 100 * 101 // 2
    assert steps.attention_s == pytest.approx(attention_ms / 1000)
    assert steps.forward_s == pytest.approx(finish / 1000)


def test_a_queued_request_finds_the_cache_as_it_is_when_it_starts() -> None:
    """Like Baton's engine, which looks a request's prefix up and names its blocks when it
    schedules it: what the requests ahead of it evicted is gone, what they stored is there;
    its events are reported at its start, in sequence order."""
    w = SimWorker("p0", capacity=3, profile=PROFILE)
    w.serve([1, 2])  # cached before
    w.submit(Queued(0, 0.0, [5, 6, 7], 48, None, 0, estimate=48))
    w.submit(Queued(1, 0.0, [1, 2, 8], 48, None, 0, estimate=16))  # 2 hits on arrival
    assert w.load(0.0).num_waiting_tokens == 48 + 16
    a = w.start_next(16)
    assert (a.start_ms, a.finish_ms, a.hit_tokens) == (0.0, 10 + 48, 0)
    assert a.events is not None
    assert [e.block_hashes for e in a.events.events] == [[5, 6, 7], [2, 1]]
    assert w.next_start() == a.finish_ms
    b = w.start_next(16)
    assert b.start_ms == a.finish_ms and b.hit_tokens == 0  # its prefix was evicted meanwhile
    assert b.events is not None and a.events.seq < b.events.seq and w.next_start() is None


def test_the_simulated_queue_starts_what_the_front_door_s_gate_would() -> None:
    """A worker's queue is its prefill gate (router.cluster.prefill_gate): a request with a
    longer prefix in the cache than the head's starts first, until the head has been passed
    over max_skips times; with 0, first in, first out."""
    w = SimWorker("p0", capacity=8, profile=PROFILE)
    w.serve([1, 2, 3])
    w.submit(Queued(0, 0.0, [5, 6], 32, None, 0, estimate=32))
    w.submit(Queued(1, 0.0, [1, 2, 3, 4], 64, None, 0, estimate=16))
    w.submit(Queued(2, 0.0, [1, 2, 3, 7], 64, None, 0, estimate=16))
    assert (w.next_index(16), w.next_index(0)) == (1, 0)
    s = w.start_next(16, w.next_index(16))
    assert s.queued.n == 1 and s.hit_tokens == 48 and w.queue[0].skips == 1
    assert (w.next_index(2), w.next_index(1)) == (1, 0)  # once passed over: its turn at 1
    assert [q.n for q in w.queue] == [0, 2]


def test_a_served_chain_loses_its_tail_first() -> None:
    """Like an engine freeing a finished request's blocks in reverse: a prompt longer than
    the cache keeps its prefix (the part a later prompt can hit), not its tail."""
    w = SimWorker("p0", capacity=3, profile=PROFILE)
    _, _, events, _ = w.serve([1, 2, 3, 4, 5])
    assert events[-1].block_hashes == [5, 4]
    assert w.serve([1, 2, 3, 9])[0] == 3


def _row(hash_ids: list[int]) -> TraceRequest:
    return TraceRequest(0, 16 * len(hash_ids), 1, hash_ids)


def test_miss_ledger_attributes_each_block() -> None:
    """Hit, routed away from a busier holder, evicted everywhere, cold, against the oracle."""
    a, b = SimWorker("a", 6, PROFILE), SimWorker("b", 6, PROFILE)
    ledger = MissLedger(capacity=8, sample_every=1)
    for chain in ([7, 8], [1, 2, 3]):
        ledger.observe(_row(chain), a, [a, b], 0.0)
        a.serve(chain)
    a.serve([20, 21, 22])  # outside the ledger's view: evicts 7 and 8 from a
    a.enqueue(0.0, 1000, 1000)  # a is busy until 1,020 ms
    ledger.observe(_row([1, 2, 3, 4, 5]), b, [a, b], 10.0)
    ledger.observe(_row([7, 8, 9]), b, [a, b], 10.0)
    m, total = ledger.summary(), 3 + 2 + 5 + 3
    assert m["hit"] == 0 and m["routed_away_holder_busier"] == 3 / total
    assert m["evicted_everywhere"] == 2 / total and m["cold"] == (3 + 2 + 2 + 1) / total
    assert m["oracle_hit"] == (3 + 2) / total and m["pooled_kept_no_worker_did"] == 2 / total
    assert 0 <= m["duplicate_share"] < 1


def test_at_load_stretches_the_clock_keeps_the_order() -> None:
    trace = shared_prefix(num_requests=50)
    slow = at_load(trace, PROFILE, num_workers=2, load=0.5)
    work = sum(PROFILE.prefill_ms(r.input_length) for r in trace)
    span = slow[-1].arrival_ms - slow[0].arrival_ms
    assert abs(work / (2 * span) - 0.5) < 1e-9
    assert [r.hash_ids for r in slow] == [r.hash_ids for r in trace]


def test_at_peak_load_the_busiest_tenth_is_that_busy() -> None:
    """A trace whose prompts grow along it: at --peak its heaviest tenth is held at the
    load, and the whole trace runs lighter."""
    trace = [
        TraceRequest(float(i), 100 if i < 80 else 400, 1, [i])
        for i in range(100)
    ]  # fmt: skip
    work = [PROFILE.prefill_ms(r.input_length) for r in trace]
    slow = at_load(trace, PROFILE, num_workers=2, load=0.6, peak=True)
    # the last tenth: each request's work over the time until the next one arrives
    busiest = sum(work[90:99]) / (2 * (slow[99].arrival_ms - slow[90].arrival_ms))
    assert busiest == pytest.approx(0.6)
    mean = sum(work) / (2 * (slow[-1].arrival_ms - slow[0].arrival_ms))
    assert mean < 0.6 / 1.5
    even = trace[:80]  # no busier part than the whole: the average
    assert sim_run.busiest_rate(even, work[:80]) == pytest.approx(sum(work[:80]) / 79)


def test_balance_slack_reaches_the_ttft_rows_only() -> None:
    args = router_sim.build_parser().parse_args(["--balance-slack", "0.15"])
    for label in ("ttft", "ttft_no_pull"):
        name, policy_args = router_sim.policy_config(label, PROFILE, args.balance_slack)
        assert name == "ttft" and policy_args["balance_slack"] == 0.15
        router_sim.make_routers(name, 2, 16, policy_args=policy_args)  # the policy takes it
    assert "balance_slack" not in router_sim.policy_config("ttft", PROFILE)[1]
    measured = router_sim.build_parser().parse_args(["--balance-measured"])
    _, policy_args = router_sim.policy_config("ttft", PROFILE, None, measured.balance_measured)
    assert policy_args["balance_measured"] is True
    router_sim.make_routers("ttft", 2, 16, policy_args=policy_args)
    assert router_sim.policy_config("cache_aware", PROFILE, 0.15) == ("cache_aware", {})


def test_one_table_per_run_on_a_trace_slice(tmp_path) -> None:
    trace_file = tmp_path / "slice.jsonl"
    write_jsonl(shared_prefix(num_requests=120, block_size=512, rate_per_s=5), trace_file)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"step_ms": 5, "token_ms": 0.01, "chunk_tokens": 2048}))
    out = tmp_path / "sim.json"
    results = router_sim.main(
        ["--trace", str(trace_file), "--profile", str(profile), "--capacity", "30", "200",
         "--workers", "4", "--workloads", "mooncake", "--out", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert set(results["runs"]) == {"mooncake@30", "mooncake@200"}
    for run in results["runs"].values():
        oracle = run["oracle_pooled_lru"]
        for policy in router_sim.POLICIES:
            r = run[policy]
            assert 0 <= r["hit_rate"] <= 1 and r["load_max_over_mean"] >= 1
            assert r["hit_over_oracle"] == pytest.approx(r["hit_rate"] / oracle["hit_rate"])
            assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"]
    table, misses = out.with_suffix(".md").read_text().split("\n\n")[::2]
    table = table.splitlines()
    assert len(table) == 2 + 2 * (1 + len(router_sim.POLICIES))
    assert table[2].startswith("| mooncake@30 | 30 | oracle (pooled LRU) |")
    assert len(misses.splitlines()) == 2 + 2 * len(router_sim.POLICIES)
    # a bigger cache never reuses less in the oracle
    runs = results["runs"]
    assert (
        runs["mooncake@200"]["oracle_pooled_lru"]["hit_rate"]
        >= runs["mooncake@30"]["oracle_pooled_lru"]["hit_rate"]
    )


def test_replicas_sync_every_sync_ms_of_simulated_time() -> None:
    """Replicas read each other's decisions as often as the propagation measured between two
    Redis stores allows (bench.routing.replica_sync): by the simulated clock, not every n
    requests."""
    trace = light_then_burst(num_prompts=4, light_requests=10, burst_requests=90,
                             light_gap_ms=100.0, burst_rate_per_s=1000.0)  # fmt: skip
    routers = router_sim.make_routers("cache_aware", 2, 16, replicas=2)
    syncs: list[float] = []
    for r in routers:
        r.store.sync = lambda timeout, r=r: syncs.append(r.store.clock()) or True
    sim_run.simulate(trace, routers, 2, 64, 16, PROFILE, sync_ms=10.0)
    times = sorted(set(syncs))
    assert len(syncs) == 2 * len(times)  # every replica at once
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.010 - 1e-9  # the clock is in seconds
    # the light phase syncs before every request (100 ms apart), the burst (~1 ms apart)
    # every 10 ms or so: far fewer syncs than requests
    assert {round(t, 6) for t in times} >= {round(0.1 * (i + 1), 6) for i in range(10)}
    last_arrival = trace[-1].arrival_ms / 1000
    assert len([t for t in times if t <= last_arrival]) < 10 + 90 // 5
    # and between arrivals too, as prefills finish (late binding routes there)
    arrivals = {round(r.arrival_ms / 1000, 6) for r in trace}
    assert any(round(t, 6) not in arrivals for t in times)


def test_the_sweep_counts_the_runs_that_meet_issue_20_s_targets(tmp_path) -> None:
    from bench.routing import router_sweep

    trace_file = tmp_path / "slice.jsonl"
    write_jsonl(shared_prefix(num_requests=200, block_size=512, rate_per_s=5), trace_file)
    out = tmp_path / "sweep.json"
    rows = router_sweep.main(
        ["--trace", str(trace_file), "--capacity", "30", "--loads", "0.9", "--burst-loads",
         "1.0", "--policy-args", '{"balance_slack": 0.3}', "--clock-jitter", "0.001",
         "--out", str(out)]
    )  # fmt: skip
    assert [(r["workload"], r.get("late_binding")) for r in rows] == [
        ("mooncake", None), ("light_then_burst", False), ("light_then_burst", True)
    ]  # fmt: skip
    for r in rows:
        least, most = router_sweep.TARGETS[r["workload"]]
        meets = r["reuse_over_oracle"] >= least and r["load_max_over_mean"] <= most
        assert r["meets"] is meets
    saved = json.loads(out.read_text())
    assert saved["policy_args"] == {"balance_slack": 0.3} and len(saved["runs"]) == 3
    met = sum(r["meets"] for r in rows)
    table = out.with_suffix(".md").read_text()
    assert f"**{met} of 3**" in table and "clock faster / one" in table
    assert all(r["jitter_computed_over_one"] > 0 for r in rows)
