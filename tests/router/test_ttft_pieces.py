"""The ttft policy's pieces one at a time: the bounded-load filter and its tiers, the tally,
the cost, the prefix pull and the picker."""

from __future__ import annotations

import pytest

from router.routing.policies import RouteContext
from router.routing.policies.ttft.bounded_load import (
    FITS,
    NO_ROOM,
    OVER_MEASURED,
    BoundedLoad,
)
from router.routing.policies.ttft.cost import TtftCost
from router.routing.policies.ttft.picker import pick
from router.routing.policies.ttft.prefix_pull import Migration
from router.routing.policies.ttft.tally import Tally
from router.routing.worker_state import WorkerState

B = 16


def ws(name: str, queued: int = 0) -> WorkerState:
    return WorkerState(name, "prefill", "m", reported_waiting_tokens=queued)


def cost() -> TtftCost:
    return TtftCost(s_per_token=1e-3, step_s=0.0, pressure_weight=1.0, max_utilization=0.95,
                    turnover_exponent=0.5)  # fmt: skip


def test_the_filter_drops_workers_over_the_bound_and_tiers_the_rest() -> None:
    tally = Tally(halflife=1e9)
    tally.placed.update({"a": 3.0, "b": 1.0, "c": 0.5})  # mean 1.5, bound 1.8 at slack 0.2
    bound = BoundedLoad(tally, 0.2, room=True, measured=False, s_per_token=1e-3).bound(
        [ws("a"), ws("b"), ws("c")]
    )
    assert bound.candidates() == [1, 2]
    assert bound.tier(2, 0.1) == FITS
    # 1.0 + 2.0 > max(1.2 * (4.5 + 2.0) / 3, 2.0) = 2.6: no room for a 2 s prefill on b
    assert bound.tier(1, 2.0) == NO_ROOM
    assert bound.over_mean(0) == pytest.approx(2.0)


def test_the_tally_decays_places_and_forgets_workers_that_left() -> None:
    tally = Tally(halflife=1.0)  # each decision halves every tally
    pool = [ws("a"), ws("b")]
    tally.place(pool, "a", 4.0)
    tally.place(pool, "b", 1.0)
    assert tally.placed == {"a": 2.0, "b": 1.0}
    tally.place([ws("c")], "c", 1.0)  # a and b left: tables over twice the pool are pruned
    assert tally.placed == {"c": 1.0}


def test_measured_work_counts_only_once_some_worker_reported_any() -> None:
    tally = Tally(halflife=1e9)
    a, b = ws("a", queued=1000), ws("b")
    assert tally.measure([a, b], s_per_token=1e-3) is None  # queues alone balance nothing
    a.step_rate.busy_s = 4.0  # engine seconds since the last decision
    assert tally.measure([a, b], 1e-3) == [4.0 + 1000 * 1e-3, 0.0]
    bound = BoundedLoad(tally, 0.2, room=True, measured=True, s_per_token=1e-3)
    assert bound.bound([a, b]).tier(0, 0.0) == OVER_MEASURED


def test_the_cost_is_its_printed_terms() -> None:
    w = ws("a", queued=200)
    pricing = cost().price(RouteContext([w], {"a": 10}, 40, 40 * B, B))
    est = pricing.estimate(w)
    assert est.uncached == 30 * B and est.wait == pytest.approx(0.2)
    assert est.cost == est.wait + est.work + est.pressure  # an idle pool: 1 / (1 - 0) = 1
    assert est.ttft == est.wait + est.work


def test_a_pull_replaces_the_estimate_only_where_it_is_cheaper() -> None:
    holder, idle = ws("a", queued=50_000), ws("b")
    ctx = RouteContext([holder, idle], {"a": 30}, 40, 40 * B, B)
    pricing = cost().price(ctx)
    fast = Migration(kv_bytes_per_token=1000.0, transfer_gbps=10.0, transfer_latency_s=0.0)
    source = fast.source(ctx)
    assert source is not None and (source.peer_id, source.num_blocks) == ("a", 30)
    pulled = fast.cheaper(pricing.estimate(idle), source, pricing)
    assert pulled.pull_blocks == 30 and pulled.uncached == 10 * B and pulled.transfer > 0
    slow = Migration(kv_bytes_per_token=1e9, transfer_gbps=0.001, transfer_latency_s=0.0)
    assert slow.cheaper(pricing.estimate(idle), source, pricing).pull_blocks == 0
    assert Migration(0.0, 0.0, 0.0).source(ctx) is None  # no transfer rate: no migration


def test_the_picker_takes_tiers_in_order_then_cost_then_tally() -> None:
    tally = Tally(halflife=1e9)
    tally.placed.update({"a": 0.2, "b": 0.1, "c": 0.0})
    workers = [ws("a"), ws("b"), ws("c")]
    bound = BoundedLoad(tally, 10.0, room=True, measured=False, s_per_token=1e-3).bound(workers)
    pricing = cost().price(RouteContext(workers, {}, 4, 4 * B, B))
    estimates = [pricing.estimate(w) for w in workers]  # equal costs
    k, runner_up = pick([0, 1, 2], estimates, [FITS, FITS, FITS], bound, start=0)
    assert k == 2 and runner_up == estimates[0].cost  # ties: the smaller tally
    k, _ = pick([0, 1, 2], estimates, [NO_ROOM, FITS, NO_ROOM], bound, start=0)
    assert k == 1  # a fitting worker before any without room
    k, runner_up = pick([0, 2], [estimates[0], estimates[2]], [NO_ROOM, NO_ROOM], bound, 0)
    assert k == 1 and runner_up == estimates[0].cost  # no room anywhere: least loaded after
