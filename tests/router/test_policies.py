"""Policies in isolation and the Router's decision flow (in-process store)."""

from __future__ import annotations

import logging

import pytest

from core.events import BlockStored, KVEventBatch, WorkerLoad
from core.hashing import hash_prompt_blocks, model_root_hash
from core.step_stats import StepTotals
from router.routing.policies import RouteContext, make_policy, policy_names
from router.routing.route import NoWorkerError, Router, RouterConfig
from router.routing.worker_state import WorkerState

TOKENS = list(range(640))  # 40 blocks of 16
HASHES = hash_prompt_blocks(TOKENS, 16, model_root_hash("m", 16))


def ws(
    name: str,
    role: str = "prefill",
    queued: int = 0,
    running: int = 0,
    free: int = 0,
    total: int = 0,
) -> WorkerState:
    return WorkerState(
        name,
        role,
        "m",
        reported_waiting_tokens=queued,
        reported_running=running,
        reported_free_blocks=free,
        total_blocks=total,
    )


def ctx(workers, cached, blocks=40, out=0) -> RouteContext:
    return RouteContext(workers, cached, blocks, blocks * 16, 16, out)


def test_registry() -> None:
    assert policy_names("prefill") == [
        "cache_aware",
        "least_loaded",
        "random",
        "round_robin",
        "ttft",
    ]
    assert policy_names("decode") == ["cache_aware", "least_loaded", "random", "round_robin"]
    with pytest.raises(ValueError, match="unknown prefill policy"):
        make_policy("nope", "prefill")
    with pytest.raises(ValueError, match="unknown middle policy"):
        make_policy("random", "middle")


def test_prefill_cost_trades_cache_against_queue() -> None:
    policy = make_policy("cache_aware", "prefill")
    a, b = ws("a", queued=100), ws("b", queued=0)
    # a holds 30 of 40 blocks: cost 160 + 100 = 260 < b's 640.
    choice = policy.choose(ctx([a, b], {"a": 30}))
    assert choice.worker is a and dict(choice.terms)["cost"] == 260
    # a's queue grows: 160 + 600 > 640.
    a.reported_waiting_tokens = 600
    assert policy.choose(ctx([a, b], {"a": 30})).worker is b


def test_prefill_ties_by_load_then_rotation() -> None:
    policy = make_policy("cache_aware", "prefill", queue_weight=0.0)
    a, b, c = ws("a", queued=50), ws("b", queued=10), ws("c", queued=10)
    picks = {policy.choose(ctx([a, b, c], {})).worker.worker_id for _ in range(4)}
    assert picks == {"b", "c"}


def test_imbalance_guard_falls_back_to_least_loaded() -> None:
    policy = make_policy("cache_aware", "prefill", balance_abs_tokens=1000, balance_rel=2.0)
    hot, cold = ws("hot", queued=5000), ws("cold", queued=100)
    choice = policy.choose(ctx([hot, cold], {"hot": 40}))
    assert choice.worker is cold and choice.reason == "imbalance_least_loaded"
    cold.reported_waiting_tokens = 4800  # gap < 1000 and ratio < 2: cache wins again
    assert policy.choose(ctx([hot, cold], {"hot": 40})).worker is hot


def test_decode_prefers_held_blocks_and_room() -> None:
    policy = make_policy("cache_aware", "decode")
    a = ws("a", "decode", running=2, free=100, total=200)
    b = ws("b", "decode", running=2, free=100, total=200)
    assert policy.choose(ctx([a, b], {"b": 40})).worker is b  # multi-turn: b holds the prompt
    b.reported_free_blocks = 1  # cannot fit the output
    assert policy.choose(ctx([a, b], {"b": 40}, out=64)).worker is a
    a.reported_free_blocks = 2
    choice = policy.choose(ctx([a, b], {}, out=64))
    assert choice.reason == "decode_no_room_most_free" and choice.worker is a


def test_simple_policies() -> None:
    workers = [ws("a", queued=5), ws("b", queued=1), ws("c", queued=9)]
    rr = make_policy("round_robin", "prefill")
    assert [rr.choose(ctx(workers, {})).worker.worker_id for _ in range(4)] == list("abca")
    assert make_policy("least_loaded", "prefill").choose(ctx(workers, {})).worker.worker_id == "b"
    r1, r2 = make_policy("random", "prefill", seed=3), make_policy("random", "prefill", seed=3)
    assert [r1.choose(ctx(workers, {})).worker for _ in range(5)] == [
        r2.choose(ctx(workers, {})).worker for _ in range(5)
    ]


def make_router(**cfg) -> Router:
    router = Router(RouterConfig(**cfg))
    for name, role in [("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode")]:
        router.add_worker(name, role, "m")
    return router


def test_router_routes_to_cache_and_logs_formula(caplog) -> None:
    router = make_router()
    router.apply(KVEventBatch("p1", 0, [BlockStored(None, HASHES[:30])]))  # model "" -> p1's
    router.apply(KVEventBatch("d1", 0, [BlockStored(None, HASHES[:10])], model="m"))
    caplog.set_level(logging.DEBUG, logger="router.routing")
    d = router.route("m", TOKENS, num_output_tokens=32, request_id="r1").decision
    assert (d.prefill_worker_id, d.prefill_cached_blocks) == ("p1", 30)
    assert (d.decode_worker_id, d.decode_cached_blocks) == ("d1", 10)
    assert d.num_prompt_tokens == 640 and not d.index_degraded
    line = caplog.records[-1].getMessage()
    assert "cost_w = w_c*(T - c_w*B + R_w/t_w) + w_q*L_w" in line and "prefill_cost" in line
    with pytest.raises(AttributeError):
        d.reason = "x"  # frozen


def test_inflight_accounting_and_reports() -> None:
    router = make_router()
    ticket = router.route("m", block_hashes=HASHES, request_id="r1", num_output_tokens=16)
    d = ticket.decision
    p = d.prefill_worker_id
    assert router.worker_load(p)[0] == 640
    assert router.worker_load(d.decode_worker_id)[1] == 1
    ticket.prefill_done()
    assert router.worker_load(p)[0] == 0
    # A report after routing already includes the request: done must not subtract again.
    router.report_load(WorkerLoad(d.decode_worker_id, "decode", 1, 0, 0, 50, 100))
    ticket.close()
    ticket.close()  # exactly once, however often it is closed
    assert router.worker_load(d.decode_worker_id) == (0, 1, 50)
    assert router.num_in_flight == 0
    with pytest.raises(ValueError, match="exactly one"):
        router.route("m")
    with pytest.raises(NoWorkerError):
        router.route("other", block_hashes=HASHES)


def test_conditional_disaggregation() -> None:
    router = make_router(disagg_min_uncached_tokens=256)
    router.apply(KVEventBatch("d0", 0, [BlockStored(None, HASHES[:35])], model="m"))
    d = router.route("m", TOKENS).decision  # d0 misses 80 tokens only
    assert d.prefill_on_decode and d.decode_worker_id == "d0"
    assert d.reason == "short_uncached_prefill_on_decode" and d.cached_blocks == 35


def report(router: Router, worker: str, role: str, waiting: int, at: float, steps=None) -> None:
    steps = steps or StepTotals()
    router.report_load(WorkerLoad(worker, role, 0, 3, waiting, 0, 0, at, steps=steps))


def backed_up_router(overflow_s: float, decode_waiting: int = 0) -> Router:
    """p0 and p1 measured at 1 ms a prefill token, each 5,000 tokens (5 s) behind."""
    router = make_router(prefill_overflow_s=overflow_s)
    for p in ("p0", "p1"):
        report(router, p, "prefill", 0, 0.0)
        report(router, p, "prefill", 5000, 1.0, StepTotals(prefill_tokens=1000, forward_s=1.0))
    for d in ("d0", "d1"):
        report(router, d, "decode", decode_waiting, 1.0)
    return router


def test_a_backed_up_prefill_pool_overflows_to_the_decode_worker() -> None:
    d = backed_up_router(overflow_s=2.0).route("m", TOKENS).decision
    assert d.prefill_on_decode and d.reason == "prefill_backed_up_prefill_on_decode"
    # under the wait it may have, or when the decode workers are further behind, it stays
    assert not backed_up_router(overflow_s=6.0).route("m", TOKENS).decision.prefill_on_decode
    router = backed_up_router(overflow_s=2.0, decode_waiting=6000)
    assert not router.route("m", TOKENS).decision.prefill_on_decode
    # off by default; and a pool that has not measured its speed has no wait to weigh
    assert not backed_up_router(overflow_s=0.0).route("m", TOKENS).decision.prefill_on_decode
    router = make_router(prefill_overflow_s=2.0)
    for p in ("p0", "p1"):
        report(router, p, "prefill", 50_000, 1.0)
    assert not router.route("m", TOKENS).decision.prefill_on_decode


def test_overflow_stops_when_the_decode_worker_is_as_far_behind() -> None:
    router = backed_up_router(overflow_s=2.0)
    on_decode = [router.route("m", list(range(i, i + 640))).decision for i in range(0, 64_000, 640)]
    to_decode = [d for d in on_decode if d.prefill_on_decode]
    # each decode worker takes prompts until its queue reaches the prefill workers' (5,000)
    assert 2 * 5000 // 640 <= len(to_decode) < len(on_decode)


def test_unified_workers_and_worker_removal() -> None:
    router = Router(RouterConfig(disagg_min_uncached_tokens=0))
    router.add_worker("u0", "unified", "m")
    router.add_worker("u1", "unified", "m")
    router.apply(KVEventBatch("u1", 0, [BlockStored(None, HASHES)], model="m"))
    d = router.route("m", TOKENS).decision
    assert d.decode_worker_id == "u1" and d.prefill_on_decode and d.cached_blocks == 40
    router.remove_worker("u1")
    d = router.route("m", TOKENS).decision
    assert d.decode_worker_id == "u0" and d.cached_blocks == 0
    with pytest.raises(ValueError, match="unknown worker role"):
        router.add_worker("x", "cook", "m")
