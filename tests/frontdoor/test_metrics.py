"""The metrics the cluster records, and the dashboard's per-second history."""

from __future__ import annotations

from router.frontdoor.metrics import LiveStats, Metrics, RequestRecord


def sample(m: Metrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return m.registry.get_sample_value(name, labels or {})


def test_cluster_hooks_export_vllm_style_names() -> None:
    m = Metrics()
    m.record_worker(
        "decode-0",
        num_running=3,
        num_waiting=1,
        kv_usage=0.5,
        prefix_hit_rate=0.25,
        num_used_blocks=8,
        num_free_blocks=8,
        steps={"steps": 10, "decode_rows": 30, "prefill_tokens": 64, "forward_s": 0.5},
    )
    m.record_worker(  # the next report: counters grow by the difference
        "decode-0",
        num_running=3,
        num_waiting=1,
        kv_usage=0.5,
        prefix_hit_rate=0.25,
        steps={
            "steps": 12,
            "decode_rows": 36,
            "prefill_tokens": 64,
            "forward_s": 0.75,
            "overlapped_steps": 10,
        },
    )
    m.record_worker(
        "prefill-0", num_running=0, num_waiting=0, kv_usage=0.0, prefix_hit_rate=0.5,
        steps={"steps": 3, "spilled_blocks": 9, "restored_blocks": 4, "swapped_blocks": 1},
    )  # fmt: skip
    m.record_kv_transfer(4096, 0.002)
    m.set_pool_size("decode", 2)
    m.record_router_decision("cache_aware")
    assert sample(m, "baton:num_requests_running", {"worker": "decode-0"}) == 3
    assert sample(m, "baton:num_requests_waiting", {"worker": "decode-0"}) == 1
    assert sample(m, "baton:kv_cache_usage_perc", {"worker": "decode-0"}) == 0.5
    assert sample(m, "baton:num_kv_blocks", {"worker": "decode-0", "state": "free"}) == 8
    assert sample(m, "baton:prefix_cache_hit_rate", {"worker": "decode-0"}) == 0.25
    assert sample(m, "baton:kv_transfer_bytes_total") == 4096
    assert sample(m, "baton:kv_transfer_seconds_count") == 1
    assert sample(m, "baton:pool_size", {"pool": "decode"}) == 2
    assert sample(m, "baton:router_decisions_total", {"policy": "cache_aware"}) == 1
    assert sample(m, "baton:worker_steps_total", {"worker": "decode-0"}) == 12
    assert sample(m, "baton:worker_overlapped_steps_total", {"worker": "decode-0"}) == 10
    tokens = {"worker": "decode-0", "kind": "decode"}
    assert sample(m, "baton:worker_step_tokens_total", tokens) == 36
    forward = {"worker": "decode-0", "phase": "forward"}
    assert sample(m, "baton:worker_step_seconds_total", forward) == 0.75
    restored = {"worker": "prefill-0", "op": "restored"}
    assert sample(m, "baton:worker_kv_offload_blocks_total", restored) == 4
    no_tiers = {**restored, "worker": "decode-0"}  # a worker without tiers: no offload series
    assert sample(m, "baton:worker_kv_offload_blocks_total", no_tiers) is None
    m.forget_worker("decode-0")
    assert sample(m, "baton:num_requests_running", {"worker": "decode-0"}) is None
    assert b"baton:pool_size" in m.exposition()[0]


def test_request_record_feeds_histograms_and_tpot() -> None:
    m = Metrics()
    rec = RequestRecord(
        "success",
        ttft_s=0.1,
        e2e_s=0.5,
        queue_s=0.01,
        num_prompt_tokens=10,
        num_output_tokens=5,
        num_cached_tokens=4,
    )
    assert abs(rec.tpot_s - 0.1) < 1e-9  # type: ignore[operator]
    m.observe_request(rec)
    assert sample(m, "baton:requests_total", {"outcome": "success"}) == 1
    assert sample(m, "baton:time_per_output_token_seconds_count") == 1
    assert sample(m, "baton:prompt_tokens_total") == 10
    assert sample(m, "baton:prefix_cache_hit_tokens_total") == 4
    assert sample(m, "baton:request_draft_acceptance_rate_count") == 0  # it did not speculate


def test_each_speculating_request_lands_in_the_acceptance_histogram() -> None:
    m = Metrics()
    for drafted, accepted in ((10, 9), (8, 2), (0, 0)):
        m.observe_request(
            RequestRecord("success", num_draft_tokens=drafted, num_accepted_tokens=accepted)
        )
    assert sample(m, "baton:request_draft_acceptance_rate_count") == 2
    assert sample(m, "baton:request_draft_acceptance_rate_bucket", {"le": "0.3"}) == 1
    assert sample(m, "baton:request_draft_acceptance_rate_bucket", {"le": "0.9"}) == 2


def test_live_stats_buckets_per_second_and_forget_old() -> None:
    now = [1000.0]
    live = LiveStats(window_s=10, clock=lambda: now[0])
    live.add(RequestRecord("success", ttft_s=0.2, e2e_s=1.2, num_output_tokens=11))
    live.add(RequestRecord("success", ttft_s=0.4, e2e_s=1.4, num_output_tokens=11))
    now[0] = 1001.5
    live.add(RequestRecord("deadline", num_output_tokens=3))
    snap = live.snapshot()
    assert snap["t"] == [1000, 1001]
    assert snap["ttft_s"][0] is not None and abs(snap["ttft_s"][0] - 0.3) < 1e-9
    assert snap["tpot_s"][1] is None
    assert snap["tokens_per_s"] == [22, 3]
    now[0] = 1010.5
    assert live.snapshot()["t"] == [1001]


def test_the_autoscalers_decision_and_every_input_are_gauges_per_pool() -> None:
    m = Metrics()
    signals = {
        "ready": 2, "starting": 1, "queued": 4, "oldest_wait_s": 1.5, "ttft_p90_s": None,
        "itl_p90_s": 0.12, "kv_usage": 0.6, "batch_usage": 0.3, "batch_growth_per_s": 0.01,
        "busy": 0.9, "tokens_per_s": 250.0,
    }  # fmt: skip
    decision = {
        "pool": "decode", "size": 3, "target": 4, "pressure": 1.5, "reason": "queue wait over",
        "signals": signals, "at": 1.7e9, "terms": {"queue wait": 1.5, "ITL p90": 0.6},
        "min_size": 1, "max_size": 8, "capacity_per_worker": None,
    }  # fmt: skip
    m.record_autoscale("decode", decision)
    pool = {"pool": "decode"}
    assert sample(m, "baton:autoscale_target_workers", pool) == 4
    assert sample(m, "baton:autoscale_current_workers", pool) == 3
    assert sample(m, "baton:autoscale_pressure", pool) == 1.5
    assert sample(m, "baton:autoscale_queued_requests", pool) == 4
    assert sample(m, "baton:autoscale_oldest_wait_seconds", pool) == 1.5
    assert sample(m, "baton:autoscale_itl_p90_seconds", pool) == 0.12
    assert sample(m, "baton:autoscale_ttft_p90_seconds", pool) is None  # no sample: no series
    assert sample(m, "baton:autoscale_kv_usage_perc", pool) == 0.6
    assert sample(m, "baton:autoscale_tokens_per_second", pool) == 250.0
    assert sample(m, "baton:autoscale_starting_workers", pool) == 1
    assert sample(m, "baton:autoscale_max_workers", pool) == 8
    assert sample(m, "baton:autoscale_capacity_tokens_per_second", pool) is None
    assert sample(m, "baton:autoscale_last_evaluation_timestamp_seconds", pool) == 1.7e9
    assert sample(m, "baton:autoscale_pressure_term", {**pool, "term": "itl_p90"}) == 0.6
    # The next decision without a term: its series goes, and a new capacity appears.
    m.record_autoscale(
        "decode", {**decision, "terms": {"queue wait": 0.2}, "capacity_per_worker": 90.0}
    )
    assert sample(m, "baton:autoscale_pressure_term", {**pool, "term": "itl_p90"}) is None
    assert sample(m, "baton:autoscale_pressure_term", {**pool, "term": "queue_wait"}) == 0.2
    assert sample(m, "baton:autoscale_capacity_tokens_per_second", pool) == 90.0


def test_workers_name_their_pool_and_failures_and_resyncs_count() -> None:
    m = Metrics()
    m.record_worker("w-1", num_running=0, num_waiting=0, kv_usage=0, prefix_hit_rate=0,
                    pool="prefill")  # fmt: skip
    assert sample(m, "baton:worker_pool", {"worker": "w-1", "pool": "prefill"}) == 1
    assert sample(m, "baton:router_index_resyncs_total", {"worker": "w-1"}) == 0
    m.record_kv_transfer_failure()
    m.record_index_resync("w-1")
    assert sample(m, "baton:kv_transfer_failures_total") == 1
    assert sample(m, "baton:router_index_resyncs_total", {"worker": "w-1"}) == 1
    m.forget_worker("w-1")
    assert sample(m, "baton:worker_pool", {"worker": "w-1", "pool": "prefill"}) is None
    assert sample(m, "baton:router_index_resyncs_total", {"worker": "w-1"}) is None
