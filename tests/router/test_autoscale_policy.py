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


def test_a_decode_batch_near_its_cap_grows_the_pool_before_anything_queues() -> None:
    """A worker that prefills its own prompts admits each one until its batch is full: near
    the cap, nothing queues yet and ITL is under target, but the next burst will queue."""
    scaler = Autoscaler(CONFIG)
    filling = PoolSignals(ready=1, batch_usage=0.94, itl_p90_s=0.08)
    decision = scaler.decide({"decode": filling}, {"decode": 1}, 0)[0]
    assert decision.target == 2 and decision.reason == "batch slots over target"
    roomy = PoolSignals(ready=1, batch_usage=0.5, itl_p90_s=0.08)
    assert targets(Autoscaler(CONFIG), {"decode": roomy}, {"decode": 1}, 0) == {"decode": 1}


def test_a_filling_batch_grows_the_pool_a_start_up_ahead_of_the_cap() -> None:
    """Half the slots in use, but filling at 4% of them a second: in `lead_s` (10 s) they
    would be 90% used, past the 85% target: a worker starts now. The same batch emptying,
    or filling slowly, asks for nothing."""
    filling = PoolSignals(ready=1, batch_usage=0.5, batch_growth_per_s=0.04)
    decision = Autoscaler(CONFIG).decide({"decode": filling}, {"decode": 1}, 0)[0]
    assert decision.target == 2 and decision.reason == "batch slots over target"
    assert decision.pressure == pytest.approx(0.9 / 0.85)
    for growth in (-0.04, 0.02):
        steady = PoolSignals(ready=1, batch_usage=0.5, batch_growth_per_s=growth)
        assert targets(Autoscaler(CONFIG), {"decode": steady}, {"decode": 1}, 0) == {"decode": 1}


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


def _burst_then_calm(scaler: Autoscaler, work: float, start: float) -> list[int]:
    """One worker over target carrying 1,000 tokens/s, scaled to two; then calm looks at
    `work` tokens/s (the pool's total), one a second from `start`: the decode sizes asked."""
    hot = {"decode": PoolSignals(ready=1, oldest_wait_s=1.5, tokens_per_s=1000.0)}
    assert targets(scaler, hot, {"decode": 1}, 0) == {"decode": 2}
    calm = {"decode": PoolSignals(ready=2, itl_p90_s=0.01, tokens_per_s=work)}
    return [targets(scaler, calm, {"decode": 2}, start + t)["decode"] for t in range(6)]


def test_a_pool_calm_because_it_is_large_keeps_its_workers() -> None:
    """Two workers carrying 1.3 workers' worth of work read calm (no queue, ITL far under
    target), but one worker alone was over target at 1,000 tokens/s: no drain mid-burst."""
    scaler = Autoscaler(CONFIG)
    assert _burst_then_calm(scaler, work=1300.0, start=100) == [2] * 6
    decision = scaler.decide(
        {"decode": PoolSignals(ready=2, tokens_per_s=1300.0)}, {"decode": 2}, 107
    )[0]
    assert decision.target == 2 and decision.reason == "calm, but 1 would carry 1.30 of capacity"
    assert scaler.capacity.capacity("decode") == pytest.approx(1000.0)


def test_a_pool_whose_work_fell_shrinks_after_its_calm_looks() -> None:
    scaler = Autoscaler(CONFIG)
    assert _burst_then_calm(scaler, work=300.0, start=100)[:3] == [2, 2, 1]


def test_the_burst_s_work_does_not_hold_the_calm_that_follows_it() -> None:
    """A calm spell that began in the burst (work the pool needs both workers for) goes on
    into the quiet phase: only its last `calm_periods` looks decide, so the pool shrinks
    once those are light."""
    scaler = Autoscaler(CONFIG)
    assert _burst_then_calm(scaler, work=1300.0, start=100) == [2] * 6
    quiet = {"decode": PoolSignals(ready=2, itl_p90_s=0.01, tokens_per_s=200.0)}
    assert [targets(scaler, quiet, {"decode": 2}, 110 + t)["decode"] for t in range(3)] == [
        2,
        2,
        1,
    ]


def test_capacity_is_learnt_only_with_every_wanted_worker_ready() -> None:
    """Over target while a worker is still starting (or missing) says less than a worker can
    do: no capacity is learnt, and a calm pool shrinks by the pressure rule alone."""
    scaler = Autoscaler(CONFIG)
    short = {"decode": PoolSignals(ready=1, starting=1, oldest_wait_s=3.0, tokens_per_s=900.0)}
    scaler.decide(short, {"decode": 2}, 0)
    missing = {"decode": PoolSignals(ready=1, oldest_wait_s=3.0, tokens_per_s=900.0)}
    scaler.decide(missing, {"decode": 2}, 1)
    assert scaler.capacity.capacity("decode") is None
    calm = {"decode": PoolSignals(ready=2, tokens_per_s=5000.0)}
    assert [targets(scaler, calm, {"decode": 2}, 100 + t)["decode"] for t in range(3)] == [2, 2, 1]


def test_a_decision_carries_every_term_its_bounds_and_the_capacity_it_divides_by() -> None:
    """What the metrics export as the decision's inputs: each pressure term (the pressure
    is the largest), the pool's bounds, and the capacity per worker once seen."""
    scaler = Autoscaler(CONFIG)
    busy = PoolSignals(ready=1, oldest_wait_s=0.5, kv_usage=0.425, itl_p90_s=0.1)
    hot = PoolSignals(ready=2, oldest_wait_s=2.0, busy=0.45, tokens_per_s=400.0)
    sizes = {"prefill": 2, "decode": 1}
    by_pool = {d.pool: d for d in scaler.decide({"prefill": hot, "decode": busy}, sizes, 0)}
    decode, prefill = by_pool["decode"], by_pool["prefill"]
    assert decode.terms == pytest.approx(
        {"queue wait": 0.5, "kv usage": 0.5, "batch slots": 0.0, "ITL p90": 0.5}
    )
    assert decode.pressure == max(decode.terms.values())
    assert (decode.min_size, decode.max_size) == (1, 4)
    assert prefill.terms == pytest.approx({"queue wait": 2.0, "busy": 0.5})
    assert (prefill.min_size, prefill.max_size) == (0, 6)
    assert prefill.capacity_per_worker == pytest.approx(200.0)  # saturated: 400 / 2 ready
    assert decode.capacity_per_worker is None
    empty = scaler.decide({"decode": PoolSignals(ready=1, oldest_wait_s=0.25)},
                          {"prefill": 0, "decode": 1}, 100)  # fmt: skip
    assert empty[0].terms == pytest.approx({"decode queue wait": 0.25})
