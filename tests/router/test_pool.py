"""The pools' sorted load order (router.routing.pool) stays true under any accounting sequence."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.events import WorkerLoad
from router.routing.load import LoadTracker
from router.routing.policies import RouteContext, make_policy
from router.routing.pool import Pool
from router.routing.worker_state import prefill_load
from tests.router.test_policies import ws

WORKERS = [("p0", "prefill"), ("p1", "prefill"), ("p2", "prefill"), ("u0", "unified")]
WORKERS += [("d0", "decode")]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 4), st.integers(0, 4), st.integers(0, 900)),
        st.tuples(st.just("admit"), st.integers(0, 30)),
        st.tuples(st.just("prefill_done"), st.integers(0, 30)),
        st.tuples(st.just("close"), st.integers(0, 30)),
        st.tuples(st.just("report"), st.integers(0, 4), st.integers(0, 900)),
        st.tuples(st.just("remove"), st.integers(0, 4)),
        st.tuples(st.just("add"), st.integers(0, 4)),
    ),
    max_size=60,
)


def brute_lightest(pool: Pool, turn: int) -> int:
    loads = [prefill_load(w) for w in pool.workers]
    lightest = [i for i, load in enumerate(loads) if load == min(loads)]
    return lightest[turn % len(lightest)]


@settings(max_examples=150, deadline=None)
@given(ops)
def test_pool_order_follows_every_load_change(op_list) -> None:
    tracker = LoadTracker()
    for name, role in WORKERS:
        tracker.add_worker(name, role, "m")
    charges = []
    for op in op_list:
        kind = op[0]
        if kind == "start":
            _, pi, di, tokens = op
            prefill = tracker.workers.get(WORKERS[pi][0])
            decode = tracker.workers.get(WORKERS[di][0])
            if decode is not None:
                charges.append(tracker.start(prefill, tokens, decode, 3))
        elif kind in ("admit", "prefill_done", "close"):
            if op[1] < len(charges):
                getattr(tracker, kind)(charges[op[1]])
        elif kind == "report":
            name, role = WORKERS[op[1]]
            tracker.report(WorkerLoad(name, role, 1, 1, op[2], 10, 20))
        elif kind == "remove":
            tracker.remove_worker(WORKERS[op[1]][0])
        else:
            tracker.add_worker(*WORKERS[op[1]], "m")
        for role in ("prefill", "decode"):
            pool = tracker.pool("m", role)
            pool.check()
            if len(pool):
                loads = [prefill_load(w) for w in pool.workers]
                assert (pool.min_load, pool.max_load) == (min(loads), max(loads))
                for turn in range(3):
                    assert pool.lightest(turn) == brute_lightest(pool, turn)


def test_prefill_policy_same_choice_with_or_without_a_kept_pool() -> None:
    workers = [ws("a", queued=300), ws("b", queued=0), ws("c", queued=0), ws("d", queued=900)]
    cached = {"a": 30, "d": 40, "elsewhere": 5}
    with_pool, without = (
        make_policy("cache_aware", "prefill"),
        make_policy("cache_aware", "prefill"),
    )
    for _ in range(5):
        ctx = RouteContext(workers, cached, 40, 640, 16, 0)
        a = with_pool.choose(ctx._replace(pool=Pool(workers)))
        b = without.choose(ctx)
        assert a == b


def test_prefill_runner_up_is_the_next_other_worker() -> None:
    # a: 640 - 30*16 + 100 = 260; b (lightest, 10 blocks): 480 + 0 = 480; c: 640 + 50
    workers = [ws("a", queued=100), ws("b", queued=0), ws("c", queued=50)]
    choice = make_policy("cache_aware", "prefill").choose(
        RouteContext(workers, {"a": 30, "b": 10}, 40, 640, 16)
    )
    terms = dict(choice.terms)
    assert choice.worker.worker_id == "a"
    assert (terms["cost"], terms["runner_up_cost"]) == (260, 480)
