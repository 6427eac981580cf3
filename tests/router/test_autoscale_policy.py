"""The autoscaler's decisions (router/cluster/autoscale/policy.py), pool by pool."""

from __future__ import annotations

import pytest

from router.cluster.autoscale.policy import AutoscaleConfig, Autoscaler, PoolSignals

CONFIG = AutoscaleConfig(
    ttft_slo_s=2.0,
    itl_slo_s=0.2,
    min_sizes={"prefill": 0, "decode": 1},
    max_sizes={"prefill": 6, "decode": 4},
    up_cooldown_s=10.0,
    down_cooldown_s=30.0,
    calm_periods=3,
)
QUIET = PoolSignals(ready=1)


def targets(scaler: Autoscaler, signals: dict, sizes: dict, now: float) -> dict[str, int]:
    return {d.pool: d.target for d in scaler.decide(signals, sizes, now)}


def test_a_growing_queue_scales_up_before_any_latency_is_seen() -> None:
    """No request has finished (no TTFT sample), but the oldest queued one has waited past
    the queue's share of the TTFT budget: the pool grows, in proportion."""
    scaler = Autoscaler(CONFIG)
    queued = PoolSignals(ready=2, queued=9, oldest_wait_s=2.0)  # budget 0.5 * 2 s: 2x over
    decisions = scaler.decide({"prefill": queued, "decode": QUIET}, {"prefill": 2, "decode": 1}, 0)
    by_pool = {d.pool: d for d in decisions}
    assert by_pool["prefill"].target == 4
    assert by_pool["prefill"].reason == "queue wait over target"
    assert by_pool["prefill"].pressure == pytest.approx(2.0)
    assert "oldest_wait_s=2" in by_pool["prefill"].line()
    assert by_pool["decode"].target == 1


def test_each_pool_reads_its_own_latency() -> None:
    scaler = Autoscaler(CONFIG)
    slow_itl = PoolSignals(ready=1, itl_p90_s=0.3, ttft_p90_s=0.1)
    slow_ttft = PoolSignals(ready=1, itl_p90_s=0.01, ttft_p90_s=3.0)
    signals = {"prefill": slow_ttft, "decode": slow_itl}
    got = targets(scaler, signals, {"prefill": 1, "decode": 1}, 0)
    assert got == {"prefill": 2, "decode": 2}


def test_a_full_kv_cache_grows_the_decode_pool() -> None:
    scaler = Autoscaler(CONFIG)
    full = PoolSignals(ready=2, kv_usage=0.95)
    assert targets(scaler, {"decode": full}, {"decode": 2}, 0) == {"decode": 3}


def test_growth_stops_at_the_maximum_and_waits_out_the_cool_down() -> None:
    scaler = Autoscaler(CONFIG)
    hot = {"prefill": PoolSignals(ready=3, oldest_wait_s=10.0)}
    assert targets(scaler, hot, {"prefill": 3}, 0) == {"prefill": 6}  # 20x asks 60: max 6
    scaler = Autoscaler(CONFIG)
    hot = {"prefill": PoolSignals(ready=1, oldest_wait_s=2.5)}  # 2.5x the queue budget
    assert targets(scaler, hot, {"prefill": 1}, 0) == {"prefill": 3}
    # Still hot 5 s later (the new workers are starting): no second step yet.
    decision = scaler.decide(hot, {"prefill": 3}, 5)[0]
    assert decision.target == 3 and "cooling down" in decision.reason
    assert targets(scaler, hot, {"prefill": 3}, 11) == {"prefill": 6}


def test_shrinks_one_worker_at_a_time_after_a_calm_spell() -> None:
    scaler = Autoscaler(CONFIG)
    calm = {"decode": PoolSignals(ready=3, busy=0.1, kv_usage=0.1)}
    assert targets(scaler, calm, {"decode": 3}, 0) == {"decode": 3}
    assert targets(scaler, calm, {"decode": 3}, 2) == {"decode": 3}
    assert targets(scaler, calm, {"decode": 3}, 4) == {"decode": 2}  # 3 calm looks
    # The next step down waits for the cool-down, however calm.
    for t in (6, 8, 10, 20):
        assert targets(scaler, calm, {"decode": 2}, t) == {"decode": 2}
    assert targets(scaler, calm, {"decode": 2}, 35) == {"decode": 1}
    assert targets(scaler, calm, {"decode": 1}, 100) == {"decode": 1}  # its minimum


def test_between_calm_and_the_target_nothing_moves_and_the_calm_count_restarts() -> None:
    """Hysteresis: a look at 0.7 of the target neither grows nor counts toward shrinking."""
    scaler = Autoscaler(CONFIG)
    calm = {"decode": PoolSignals(ready=2, itl_p90_s=0.01)}
    middling = {"decode": PoolSignals(ready=2, itl_p90_s=0.7 * CONFIG.itl_slo_s)}
    assert targets(scaler, calm, {"decode": 2}, 0) == {"decode": 2}
    assert targets(scaler, calm, {"decode": 2}, 1) == {"decode": 2}
    assert targets(scaler, middling, {"decode": 2}, 2) == {"decode": 2}
    assert targets(scaler, calm, {"decode": 2}, 3) == {"decode": 2}
    assert targets(scaler, calm, {"decode": 2}, 4) == {"decode": 2}
    assert targets(scaler, calm, {"decode": 2}, 5) == {"decode": 1}


def test_a_decode_pool_stepping_all_the_time_under_its_itl_target_does_not_grow() -> None:
    scaler = Autoscaler(CONFIG)
    light = {"decode": PoolSignals(ready=1, busy=0.95, itl_p90_s=0.1 * CONFIG.itl_slo_s)}
    assert targets(scaler, light, {"decode": 1}, 0) == {"decode": 1}
    prefill = {"prefill": PoolSignals(ready=1, busy=0.95)}  # a prefill worker is saturated
    assert targets(scaler, prefill, {"prefill": 1}, 0) == {"prefill": 2}


def test_the_prefill_pool_goes_to_zero_and_comes_back_on_the_decode_queue() -> None:
    scaler = Autoscaler(CONFIG)
    idle = {"prefill": PoolSignals(ready=1), "decode": QUIET}
    for t in range(3):
        got = targets(scaler, idle, {"prefill": 1, "decode": 1}, t)
    assert got == {"prefill": 0, "decode": 1}
    # Decode workers prefill alone now; prompts start queueing there.
    busy_decode = PoolSignals(ready=1, oldest_wait_s=1.2, busy=0.5)
    got = targets(scaler, {"decode": busy_decode}, {"prefill": 0, "decode": 1}, 40)
    assert got["prefill"] >= 1


def test_a_pool_with_workers_starting_does_not_shrink() -> None:
    """The calm of a pool whose workers are still loading says nothing about its load."""
    scaler = Autoscaler(CONFIG)
    loading = {"decode": PoolSignals(ready=1, starting=1)}
    for t in range(10):
        decision = scaler.decide(loading, {"decode": 2}, t * 100)[0]
        assert decision.target == 2 and decision.reason == "workers starting"
    calm = {"decode": PoolSignals(ready=2)}
    assert [targets(scaler, calm, {"decode": 2}, 1000 + t)["decode"] for t in range(3)] == [2, 2, 1]


def test_a_unified_pool_takes_the_decode_bounds() -> None:
    scaler = Autoscaler(CONFIG)
    hot = {"unified": PoolSignals(ready=2, ttft_p90_s=5.0)}
    assert targets(scaler, hot, {"unified": 2}, 0) == {"unified": 4}  # decode max 4


def test_sizes_outside_the_bounds_are_brought_inside() -> None:
    scaler = Autoscaler(CONFIG)
    got = targets(scaler, {}, {"prefill": 9, "decode": 0}, 0)
    assert got == {"prefill": 6, "decode": 1}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ttft_slo_s": 0},
        {"itl_slo_s": -1},
        {"calm": 1.0},
        {"min_sizes": {"prefill": 3, "decode": 1}, "max_sizes": {"prefill": 2, "decode": 2}},
        {"min_sizes": {"prefill": 0, "decode": 0}},
    ],
)
def test_bad_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        AutoscaleConfig(**kwargs)
