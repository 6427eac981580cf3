"""The pieces a routing policy is configured from (filters, scorers, pickers), one at a time,
and the configurations the registry builds from them."""

from __future__ import annotations

import pytest

from router.routing.policies import (
    Candidates,
    Choice,
    Configuration,
    Pipeline,
    RouteContext,
    Use,
    make_policy,
)
from router.routing.policies.configurations import cache_aware_prefill_config
from router.routing.policies.filters import CacheCandidates, HasRoom, ImbalanceGuard
from router.routing.policies.pickers import LeastCost, MaxScore
from router.routing.policies.plugin import Picker, make_plugin
from router.routing.policies.scorers import BatchShare, ComputeTokens, LoadRank
from router.routing.worker_state import WorkerState

B = 16


def ws(name: str, queued: int = 0, running: int = 0, free: int = 0, total: int = 0, role="prefill"):
    return WorkerState(
        name, role, "m", reported_waiting_tokens=queued, reported_running=running,
        reported_free_blocks=free, total_blocks=total,
    )  # fmt: skip


def cands(workers, cached=None, blocks=40, out=0, turn=1, restore=None) -> Candidates:
    ctx = RouteContext(
        workers, cached or {}, blocks, blocks * B, B, out, restore_s=restore or {}
    )  # fmt: skip
    return Candidates(ctx, turn)


def test_imbalance_guard_settles_on_the_lightest_only_when_gap_and_ratio_are_both_over() -> None:
    guard = ImbalanceGuard(balance_abs_tokens=1000, balance_rel=2.0)
    hot, cold = ws("hot", queued=5000), ws("cold", queued=100)
    settled = guard.filter(cands([hot, cold]))
    assert isinstance(settled, Choice)
    assert settled.worker is cold and settled.reason == "imbalance_least_loaded"
    assert dict(settled.terms) == {"max_load": 5000.0, "min_load": 100.0}
    cold.reported_waiting_tokens = 3000  # gap over 1000, ratio under 2: no verdict
    assert list(guard.filter(cands([hot, cold]))) == [0, 1]


def test_cache_candidates_keep_the_hits_and_the_lightest_worker() -> None:
    workers = [ws("a", queued=50), ws("b", queued=10), ws("c", queued=90), ws("d", queued=70)]
    kept = CacheCandidates().filter(cands(workers, {"c": 3, "elsewhere": 9}))
    assert sorted(kept) == [1, 2]  # b (lightest) and c (a hit); a and d cannot win
    # a hit in a slow tier may cost more than none: the lightest worker holding none joins
    kept = CacheCandidates().filter(cands(workers, {"b": 3}, restore={"b": 1.0}))
    assert sorted(kept) == [0, 1]


def test_has_room_keeps_who_fits_and_else_settles_on_the_roomiest() -> None:
    a = ws("a", running=1, free=10, total=100, role="decode")
    b = ws("b", running=1, free=50, total=100, role="decode")
    new = ws("new", role="decode")  # never reported: always fits
    assert list(HasRoom().filter(cands([a, b, new], blocks=20))) == [1, 2]
    settled = HasRoom().filter(cands([a, b], blocks=60))
    assert settled.worker is b and settled.reason == "decode_no_room_most_free"


def test_load_rank_scores_in_zero_one_with_the_tie_break_inside() -> None:
    workers = [ws("a", queued=5), ws("b", queued=1, running=2), ws("c", queued=1), ws("d", 5)]
    scores = LoadRank("prefill").score(cands(workers))
    assert scores == [0.0, 0.5, 1.0, 0.0]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert LoadRank("prefill").score(cands([ws("a"), ws("b")])) == [1.0, 1.0]


def test_costs_are_the_formula_s_terms() -> None:
    a, b = ws("a"), ws("b")
    b.step_rate.s_per_token = 1e-3
    c = cands([a, b], {"a": 30, "b": 10}, restore={"b": 0.05})
    # a: 640 - 30 * 16 = 160 tokens; b: 640 - 160 = 480, plus 0.05 s at 1 ms / token
    assert ComputeTokens().score(c) == [160, 480 + 50.0]
    assert ComputeTokens().terms(c, 1) == (480.0, 10.0, 50.0)
    busy = [ws("a", running=3, role="decode"), ws("b", running=1, role="decode")]
    assert BatchShare().score(cands(busy)) == [3 / 4, 1 / 4]


def test_least_cost_breaks_ties_by_load_then_rotation() -> None:
    workers = [ws("a", queued=10), ws("b", queued=10), ws("c", queued=0)]
    picker = LeastCost(tie="prefill_load", start="turn", runner_up=True)
    assert picker.pick(cands(workers, turn=3), [5.0, 5.0, 9.0]) == 0  # rotation starts at a
    c = cands(workers, turn=1)  # rotation starts at b
    assert picker.pick(c, [5.0, 5.0, 9.0]) == 1
    assert picker.terms(c, [5.0, 5.0, 9.0], 1) == (5.0, 5.0)
    assert picker.pick(c, [5.0, 5.0, 5.0]) == 2  # c is the lightest
    assert MaxScore().pick(cands(workers), [0.2, 0.9, 0.9]) == 1


def test_a_configuration_is_data_the_registry_builds() -> None:
    config = cache_aware_prefill_config(queue_weight=0.5)
    assert str(config) == (
        "cache_aware: imbalance_guard(balance_abs_tokens=32768, balance_rel=2.0) -> "
        "cache_candidates -> 1*compute_tokens(s_per_token=0.002) + 0.5*queued_tokens -> "
        "least_cost(tie=prefill_load, start=lightest, runner_up=True)"
    )
    policy = make_policy("cache_aware", "prefill", queue_weight=0.5)
    assert isinstance(policy, Pipeline) and policy.config == config
    a, b = ws("a", queued=600), ws("b")
    # a: 160 + 0.5 * 600 = 460 < b's 640
    assert policy.choose(RouteContext([a, b], {"a": 30}, 40, 640, B)).worker is a


def test_a_new_configuration_needs_no_new_code() -> None:
    """llm-d's example: the prefix cost weighs twice the queue's."""
    config = Configuration(
        "prefix_first",
        Use("least_cost", {"tie": "prefill_load", "start": "turn"}),
        scorers=((2.0, Use("compute_tokens")), (1.0, Use("queued_tokens"))),
    )
    a, b = ws("a", queued=1000), ws("b")
    choice = config.build("prefill").choose(RouteContext([a, b], {"a": 30}, 40, 640, B))
    assert choice.worker is b and dict(choice.terms)["cost"] == 2 * 640  # a: 2*160 + 1000
    assert choice.reason == "prefix_first"


def test_unknown_names_are_errors_that_name_them() -> None:
    with pytest.raises(ValueError, match=r"unknown prefill policy 'nope'; choose from \["):
        make_policy("nope", "prefill")
    bad = Configuration("x", Use("max_score"), scorers=((1.0, Use("no_such_scorer")),))
    with pytest.raises(ValueError, match="unknown scorer 'no_such_scorer'; choose from"):
        bad.build("prefill")
    with pytest.raises(ValueError, match="unknown filter 'max_score'"):
        Configuration("x", Use("max_score"), filters=(Use("max_score"),)).build("prefill")
    with pytest.raises(ValueError, match="unknown picker 'sideways'"):
        make_plugin(Picker, "sideways", {})


def test_scores_and_costs_do_not_mix_and_pickers_must_match() -> None:
    mixed = Configuration(
        "x", Use("max_score"),
        scorers=((1.0, Use("load_rank", {"pool": "prefill"})), (1.0, Use("queued_tokens"))),
    )  # fmt: skip
    with pytest.raises(ValueError, match="scores and costs do not add up"):
        mixed.build("prefill")
    wrong = Configuration("x", Use("max_score"), scorers=((1.0, Use("queued_tokens")),))
    with pytest.raises(ValueError, match="wants scores"):
        wrong.build("prefill")
    with pytest.raises(ValueError, match="weights must be >= 0"):
        make_policy("cache_aware", "decode", kv_weight=-1.0)
