"""How right the router was (router.routing.accuracy): the prediction against what a worker
reused, capped as the engine caps reuse; a worker whose reuse keeps falling short of its own
events is resynced once, then not again within the cooldown; promises are not held against
the index."""

from __future__ import annotations

import pytest

from core.events import AllBlocksCleared, BlockStored, KVEventBatch
from router.frontdoor.metrics import Metrics
from router.routing.accuracy import AccuracyConfig, PredictionCheck, reuse
from router.routing.route import Router, RouterConfig

BLOCK = 16
MODEL = "m"


def test_reuse_caps_the_prediction_at_what_the_engine_can_reuse() -> None:
    # A prompt of exactly 4 blocks reuses at most 3: its last token is always computed.
    r = reuse("p", predicted=4, reported=4, reused_tokens=3 * BLOCK, num_prompt_tokens=64,
              block_size=BLOCK)  # fmt: skip
    assert (r.predicted, r.reported, r.reused, r.error, r.stale) == (3, 3, 3, 0, False)
    r = reuse("p", 5, 2, 0, 100, BLOCK)
    assert (r.error, r.stale) == (5, True)
    assert reuse("p", 0, 0, 2 * BLOCK, 100, BLOCK).error == -2  # it held more than known


def test_a_worker_is_resynced_once_its_window_holds_max_over_stale() -> None:
    now = [0.0]
    check = PredictionCheck(AccuracyConfig(window=4, max_over=2, cooldown_s=5), lambda: now[0])
    fine, stale = reuse("p", 3, 3, 48, 100, BLOCK), reuse("p", 3, 3, 0, 100, BLOCK)
    assert [check.observe(r) for r in (fine, stale, fine, stale)] == [False, False, False, True]
    # Within the cooldown the same worker is not resynced again, however wrong.
    assert [check.observe(stale) for _ in range(4)] == [False] * 4
    now[0] = 6.0
    assert check.observe(stale) is True
    # Stale judgements older than the window do not count.
    check.forget("p")
    now[0] = 20.0
    assert [check.observe(r) for r in (stale, fine, fine, fine, fine, stale)] == [False] * 6


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [("window", {"window": 0}), ("max_over", {"max_over": 17}), ("cooldown_s", {"cooldown_s": -1})],
)
def test_bad_config_names_the_field(field: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=field):
        AccuracyConfig(**kwargs)


def _router(resyncs: list[tuple[str, str]]) -> Router:
    config = RouterConfig(
        disagg_min_uncached_tokens=0,
        accuracy=AccuracyConfig(window=4, max_over=2, cooldown_s=60),
    )
    router = Router(config, on_resync=lambda model, worker: resyncs.append((model, worker)))
    router.add_worker("p", "prefill", MODEL)
    router.add_worker("d", "decode", MODEL)
    for worker in ("p", "d"):  # each opens its life with an empty cache
        router.apply(KVEventBatch(worker, 0, [AllBlocksCleared()], model=MODEL))
    resyncs.clear()
    return router


def test_a_stale_entry_is_resynced_and_the_decision_carries_both_counts() -> None:
    resyncs: list[tuple[str, str]] = []
    router = _router(resyncs)
    heard: list = []
    router.on_reuse = lambda r, resynced: heard.append((r, resynced))
    prompts = [[1000 * i + t for t in range(5 * BLOCK)] for i in range(3)]
    hashes = [router.hash_blocks(MODEL, p) for p in prompts]
    # The index credits p with every prompt's blocks (events of a cache it no longer has).
    phantom = [AllBlocksCleared(), *(BlockStored(None, h) for h in hashes)]
    router.apply(KVEventBatch("p", 0, phantom, model=MODEL))
    for prompt in prompts[:2]:
        ticket = router.route(MODEL, prompt)
        decision = ticket.decision
        assert decision.prefill_worker_id == "p"
        assert decision.prefill_reported_blocks == decision.prefill_cached_blocks == 5
        router.observe_reuse(decision, "p", reused_tokens=0)
        ticket.close()
    # Capped: the last token is computed, so 4 of the 5 blocks were reusable.
    assert [(r.error, r.stale, resynced) for r, resynced in heard] == [
        (4, True, False),
        (4, True, True),
    ]
    assert resyncs == [(MODEL, "p")]


def test_blocks_promised_to_a_prefill_in_flight_are_not_held_against_the_index() -> None:
    resyncs: list[tuple[str, str]] = []
    router = _router(resyncs)
    heard: list = []
    router.on_reuse = lambda r, resynced: heard.append((r, resynced))
    prompt = list(range(5 * BLOCK))
    first = router.route(MODEL, prompt)  # its prefill is promised to p, not yet reported
    for _ in range(4):
        ticket = router.route(MODEL, prompt)
        decision = ticket.decision
        assert decision.prefill_cached_blocks == 5 and decision.prefill_reported_blocks == 0
        router.observe_reuse(decision, "p", reused_tokens=0)
        ticket.close()
    first.close()
    assert [(r.error, r.stale, resynced) for r, resynced in heard] == [(4, False, False)] * 4
    assert resyncs == []


def test_metrics_count_each_direction_per_worker() -> None:
    metrics = Metrics()
    metrics.accuracy.record("p", 2, 2)
    metrics.accuracy.record("p", 3, 0)
    metrics.accuracy.record("p", 0, 1)
    get = metrics.registry.get_sample_value
    assert get("baton:router_prefix_prediction_error_blocks_count", {"worker": "p"}) == 3
    assert (
        get("baton:router_prefix_prediction_error_blocks_bucket", {"worker": "p", "le": "0.0"}) == 2
    )
    assert (
        get("baton:router_prefix_mispredictions_total", {"worker": "p", "direction": "over"}) == 1
    )
    assert (
        get("baton:router_prefix_mispredictions_total", {"worker": "p", "direction": "under"}) == 1
    )
    assert get("baton:router_prefix_predicted_blocks_total", {"worker": "p"}) == 5
    assert get("baton:router_prefix_reused_blocks_total", {"worker": "p"}) == 3
    metrics.forget_worker("p")
    assert get("baton:router_prefix_predicted_blocks_total", {"worker": "p"}) is None
    assert get("baton:router_prefix_prediction_error_blocks_count", {"worker": "p"}) is None
