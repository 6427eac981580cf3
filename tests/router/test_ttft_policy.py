"""The cost-in-time prefill policy: its TTFT estimate, the cache-pressure term, bounded load,
and how the Router feeds it (block counts, calibrated speeds, the debug line)."""

from __future__ import annotations

import logging

import pytest

from core.events import BlockStored, KVEventBatch, WorkerLoad
from core.step_stats import StepTotals
from router.routing.policies import RouteContext, make_policy
from router.routing.route import Router, RouterConfig
from router.routing.worker_state import WorkerState

B = 16


def ws(name: str, queued: int = 0, total: int = 0) -> WorkerState:
    return WorkerState(name, "prefill", "m", reported_waiting_tokens=queued, total_blocks=total)


def ctx(workers, cached, blocks=40, held=None) -> RouteContext:
    return RouteContext(workers, cached, blocks, blocks * B, B, held_blocks=held or {})


def test_prefers_the_cached_worker_when_it_is_idle() -> None:
    policy = make_policy("ttft", "prefill")
    a, b, c = ws("a"), ws("b"), ws("c")
    choice = policy.choose(ctx([a, b, c], {"b": 30}))
    terms = dict(choice.terms)
    assert choice.worker is b
    assert terms["uncached_tokens"] == 10 * B and terms["wait_s"] == 0


def test_spills_when_the_cached_worker_is_busy() -> None:
    policy = make_policy("ttft", "prefill")
    a, b = ws("a", queued=100), ws("b")
    assert policy.choose(ctx([a, b], {"a": 30})).worker is a  # short queue: the hit wins
    a.reported_waiting_tokens = 5000  # waiting 5,000 tokens costs more than computing 480
    choice = policy.choose(ctx([a, b], {"a": 30}))
    assert choice.worker is b and dict(choice.terms)["uncached_tokens"] == 40 * B


def test_under_load_a_hit_outweighs_a_shorter_queue() -> None:
    """Work placed on a busy pool delays everyone behind it: at utilization 0.8 the policy
    keeps a hit that an idle pool would trade for a shorter queue."""
    a, b = ws("a", queued=600), ws("b")
    assert make_policy("ttft", "prefill").choose(ctx([a, b], {"a": 20})).worker is b
    for w in (a, b):
        w.step_rate.utilization = 0.8
    assert make_policy("ttft", "prefill").choose(ctx([a, b], {"a": 20})).worker is a


def test_work_weighs_by_the_pool_s_utilization_not_the_worker_s() -> None:
    """A busy holder's queue is in its wait already: weighing its remaining work by its own
    utilization as well (x20 at 0.95) sent the prompt to an idle worker to compute it all."""
    holder, idle = ws("a"), ws("b")
    holder.step_rate.utilization = 0.95
    choice = make_policy("ttft", "prefill").choose(ctx([holder, idle], {"a": 20}))
    assert choice.worker is holder
    assert dict(choice.terms)["utilization"] == 0.475


def test_cache_pressure_avoids_evicting_a_hot_cache() -> None:
    for order in ("ab", "ba"):  # whatever the tie-break rotation
        full, roomy = ws("a", total=100), ws("b", total=100)
        full.step_rate.reuse_rate = roomy.step_rate.reuse_rate = 0.8
        workers = [full, roomy] if order == "ab" else [roomy, full]
        choice = make_policy("ttft", "prefill").choose(ctx(workers, {}, held={"a": 100, "b": 10}))
        assert choice.worker is roomy and dict(choice.terms)["evict_blocks"] == 0
    # a cache that is never reused costs nothing to evict: the full worker may win again
    full, roomy = ws("a", total=100), ws("b", total=100)
    policy = make_policy("ttft", "prefill")
    choice = policy.choose(ctx([full, roomy], {"a": 1}, held={"a": 100, "b": 10}))
    assert choice.worker is full and dict(choice.terms)["pressure_s"] == 0


def test_calibrated_speed_steers_away_from_a_slow_worker() -> None:
    fast, slow = ws("a"), ws("b")
    fast.step_rate.s_per_token, slow.step_rate.s_per_token = 1e-4, 1e-2
    policy = make_policy("ttft", "prefill")
    assert policy.choose(ctx([fast, slow], {"b": 10})).worker is fast


def test_a_hit_does_not_save_the_new_tokens_attention_over_it() -> None:
    """With attention timed, a prefill after a cached prefix still attends over it: the
    estimate counts the attention's area U * (C + U / 2) (core.perf), so a long hit saves less
    than its tokens."""
    w = ws("a")
    w.step_rate.s_per_token = 3e-3
    w.step_rate.s_per_token_linear, w.step_rate.s_per_pair = 1e-3, 1e-6
    policy = make_policy("ttft", "prefill", step_s=0.0)
    terms = dict(policy.choose(ctx([w], {"a": 30})).terms)  # 160 new tokens after 480
    assert terms["prefill_s"] == pytest.approx(160 * 1e-3 + 1e-6 * 160 * (480 + 160 / 2))
    w.step_rate.s_per_pair = 0.0  # not timed (a GPU): one rate per token
    terms = dict(policy.choose(ctx([w], {"a": 30})).terms)
    assert terms["prefill_s"] == 160 * 3e-3


def _router(policy: str = "ttft", n: int = 4) -> Router:
    router = Router(RouterConfig(prefill_policy=policy, disagg_min_uncached_tokens=0))
    for i in range(n):
        router.add_worker(f"p{i}", "prefill", "m")
    router.add_worker("d0", "decode", "m")
    return router


def _serve(router: Router, worker: str, hashes: list[int], seq: int) -> None:
    router.apply(KVEventBatch(worker, seq, [BlockStored(None, hashes)], model="m"))


def test_spreads_prompts_that_share_only_their_first_block() -> None:
    """Every prompt opens with the same block and no queue ever forms (each prefill is done
    before the next arrives): a pure prefix-follower pins them all to the first worker."""
    counts: dict[str, dict[str, int]] = {}
    for policy in ("ttft", "cache_aware"):
        router, seqs, placed = _router(policy), {}, {}
        for k in range(32):
            hashes = [7, *range(100 * k + 1, 100 * k + 9)]
            ticket = router.route("m", block_hashes=hashes, num_prompt_tokens=9 * B)
            worker = ticket.decision.prefill_worker_id or ""
            _serve(router, worker, hashes, seqs.setdefault(worker, 0))
            seqs[worker] += 1
            placed[worker] = placed.get(worker, 0) + 1
            ticket.close()
        counts[policy] = placed
    assert max(counts["cache_aware"].values()) == 32  # the failure being fixed
    assert len(counts["ttft"]) == 4 and max(counts["ttft"].values()) <= 10


def test_a_prompt_no_worker_has_room_for_goes_where_it_overshoots_least() -> None:
    """The bound counts the request's own work (consistent hashing with bounded loads): a
    long prompt that takes every worker over it goes to the least loaded after it, not to
    the cheapest (b, which caches 2 of its 40 blocks and sits near the bound already)."""
    a, b, c = ws("a"), ws("b"), ws("c")
    for room in (True, False):
        policy = make_policy("ttft", "prefill", balance_room=room)
        policy.tally.placed.update(
            {"a": 1.0, "b": 1.1, "c": 0.9}
        )  # placed seconds, decayed: mean 1.0
        choice = policy.choose(ctx([a, b, c], {"b": 2}))
        assert choice.worker is (c if room else b)
    terms = dict(make_policy("ttft", "prefill", balance_room=True).choose(ctx([a, b, c], {})).terms)
    assert terms["cost_s"] == terms["prefill_s"]
    # a short prompt fits under the bound on b: the cheapest wins as without the check
    policy = make_policy("ttft", "prefill", balance_room=True)
    policy.tally.placed.update({"a": 1.0, "b": 1.1, "c": 0.9})
    assert policy.choose(ctx([a, b, c], {"b": 2}, blocks=3)).worker is b


def test_a_replica_bounds_the_pool_s_placements_not_only_its_own() -> None:
    """Four router replicas each see a quarter of the decisions: the other three each send
    their first prompt cached on b to b (nothing placed yet, as far as each knows), and the
    fourth, hearing their placements (their Choices' placed_s, through the load shares),
    finds b over the pool's bound; deaf to them it piles a fourth prompt on b."""
    a, b, c = ws("a"), ws("b"), ws("c")
    heard, deaf = make_policy("ttft", "prefill"), make_policy("ttft", "prefill")
    for _ in range(3):
        choice = make_policy("ttft", "prefill").choose(ctx([a, b, c], {"b": 38}))
        assert choice.worker is b and choice.placed_s == dict(choice.terms)["prefill_s"] > 0
        heard.placed_elsewhere([a, b, c], "b", choice.placed_s)
    heard.placed_elsewhere([a, b], "z", 1.0)  # a worker not in the pool: nothing counts
    assert set(heard.tally.placed) == {"a", "b", "c"} and heard.tally.placed["b"] > 0
    assert deaf.choose(ctx([a, b, c], {"b": 38})).worker is b
    assert heard.choose(ctx([a, b, c], {"b": 38})).worker is not b


def _report(worker: WorkerState, busy_s: float, at: float) -> None:
    worker.step_rate.update(
        WorkerLoad(worker.worker_id, "prefill", 0, 0, 0, 100, 100, at,
                   steps=StepTotals(steps=1, prefill_tokens=int(busy_s * 500), forward_s=busy_s))
    )  # fmt: skip


def test_the_bound_holds_on_measured_work_too() -> None:
    """Routing-time estimates and the work done differ (a hit evicted while the request
    queued, attention the estimate misses): a worker whose reports show far more engine time
    than the others' is no candidate, even while the policy's own tally of placed work says
    it is light; without reports there is nothing measured and the bound stays on placed
    work alone."""
    for measured in (True, False):
        policy = make_policy("ttft", "prefill", balance_measured=measured)
        a, b, c = ws("a"), ws("b"), ws("c")
        for w in (a, b, c):
            _report(w, 1.0, 0.0)
        for w in (a, b, c):  # one hit each: equal placed work; nothing measured yet
            assert policy.choose(ctx([a, b, c], {w.worker_id: 30})).worker is w
        _report(a, 60.0, 1.0)  # a spent a minute on work no estimate foresaw
        for w in (b, c):
            _report(w, 2.0, 1.0)
        choice = policy.choose(ctx([a, b, c], {"a": 30}))
        assert (choice.worker is not a) is measured


def test_a_restarted_worker_s_measured_work_starts_again() -> None:
    policy = make_policy("ttft", "prefill", balance_measured=True)
    a, b = ws("a"), ws("b")
    for w in (a, b):
        _report(w, 10.0, 0.0)
    policy.choose(ctx([a, b], {}))
    _report(a, 0.5, 1.0)  # restarted: its total went back; nothing negative is counted
    _report(b, 12.0, 1.0)
    policy.choose(ctx([a, b], {}))
    assert policy.tally.measured.get("a", 0.0) == 0.0 and policy.tally.measured["b"] > 1.9


def test_router_feeds_block_counts_and_calibration(caplog) -> None:
    router = _router()
    _serve(router, "p1", list(range(1, 31)), 0)
    steps = StepTotals(steps=10, prefill_tokens=1000, forward_s=1.0)
    for at, scale in ((1.0, 1), (2.0, 2)):
        load = WorkerLoad("p1", "prefill", 0, 0, 0, 100, 100, at, steps=steps)
        router.report_load(load)
        steps = StepTotals(steps=20 * scale, prefill_tokens=2000 * scale, forward_s=3.0 * scale)
    with caplog.at_level(logging.DEBUG, logger="router.routing.route"):
        ticket = router.route("m", block_hashes=list(range(1, 41)), num_prompt_tokens=40 * B)
    assert ticket.decision.prefill_worker_id == "p1"
    assert "cost_w = t_w*L_w" in caplog.text and "prefill_wait_s" in caplog.text
    state = router._loads.workers["p1"]
    assert abs(state.step_rate.s_per_token - 2.0 / 1000) < 1e-12  # (3 - 1) s / 1000 tokens
    assert 0 < state.step_rate.utilization <= 1
