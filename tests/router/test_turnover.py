"""How fast each worker's cache turns over (router/routing/index/turnover.py), as the store
keeps it from KV events, and how the `ttft` policy weighs evictions by it."""

from __future__ import annotations

from core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from router.routing.index.store import InProcessStore
from router.routing.index.turnover import Turnover
from router.routing.policies import RouteContext, make_policy
from router.routing.worker_state import WorkerState


def test_the_tail_s_age_is_the_time_since_the_oldest_of_the_held_blocks_was_stored() -> None:
    t = Turnover()
    t.applied("w", 4, now=10.0, held=4)
    t.applied("w", 2, now=20.0, held=6)
    assert t.tail_ages(now=25.0) == {"w": 15.0}
    t.applied("w", 0, now=21.0, held=2)  # removals only: the 2 latest, stored at 20 s
    assert t.tail_ages(now=25.0) == {"w": 5.0}
    t.applied("v", 3, now=21.0, held=7)  # it never stored 7: nothing known
    assert "v" not in t.tail_ages(now=25.0)
    t.applied("w", 3, now=30.0, held=3)
    assert t.tail_ages(now=31.0) == {"w": 1.0}
    t.forget("w")
    assert t.tail_ages(now=31.0) == {}


def test_the_log_keeps_only_the_batches_of_one_turnover() -> None:
    t = Turnover()
    for i in range(1000):
        t.applied("w", 2, now=float(i), held=10)
    assert len(t._log["w"]) == 5
    assert t.tail_ages(now=1000.0) == {"w": 5.0}


def batch(seq: int, *events, worker: str = "w") -> KVEventBatch:
    return KVEventBatch(worker, seq, list(events), model="m")


def test_the_store_times_stores_on_its_clock_and_skips_snapshots_and_duplicates() -> None:
    store = InProcessStore()
    now = [100.0]
    store.clock = lambda: now[0]
    store.publish(batch(0, AllBlocksCleared(), BlockStored(None, [1, 2, 3])))  # a snapshot
    assert store.cache_views("m") == ({"w": 3}, {})
    now[0] = 110.0
    store.publish(batch(1, BlockStored(3, [4, 5, 6]), BlockRemoved([1, 2, 3])))
    now[0] = 112.0
    store.publish(batch(1, BlockStored(3, [7, 8, 9])))  # a duplicate: ignored
    assert store.cache_views("m") == ({"w": 3}, {"w": 2.0})
    store.publish(batch(2, AllBlocksCleared(), BlockStored(None, [4, 5, 6])))
    assert store.cache_views("m") == ({"w": 3}, {})


def worker(name: str) -> WorkerState:
    w = WorkerState(name, "prefill", "m", total_blocks=100)
    w.step_rate.reuse_rate = 0.5
    return w


def test_a_new_prompt_evicts_where_the_cache_turns_over_slowest() -> None:
    """Two full caches, the same reuse: the one whose tail was stored long ago loses less."""
    for order in ("ab", "ba"):  # whatever the tie-break rotation
        churning, slow = worker("a"), worker("b")
        workers = [churning, slow] if order == "ab" else [slow, churning]
        ctx = RouteContext(
            workers, {}, 40, 640, 16, held_blocks={"a": 100, "b": 100},
            tail_age_s={"a": 10.0, "b": 90.0},
        )  # fmt: skip
        choice = make_policy("ttft", "prefill").choose(ctx)
        assert choice.worker is slow
    off = make_policy("ttft", "prefill", turnover_exponent=0.0)
    ctx = RouteContext(
        [churning, slow], {}, 40, 640, 16, held_blocks={"a": 100, "b": 100},
        tail_age_s={"a": 10.0, "b": 90.0},
    )  # fmt: skip
    terms = [dict(off.choose(ctx).terms)["pressure_s"] for _ in range(2)]
    assert terms[0] == terms[1]  # off: every eviction alike
