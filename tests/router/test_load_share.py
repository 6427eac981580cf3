"""Router replicas count each other's routed prefill work (router.routing.load_share): two
ledgers joined by a list, then two routers joined by a real redis-server."""

from __future__ import annotations

import uuid

import msgspec

from core.events import WorkerLoad
from core.step_stats import StepTotals
from router.routing.index.redis_store import RedisStore
from router.routing.load import LoadTracker
from router.routing.load_share import LoadShare, Stage
from router.routing.route import Router, RouterConfig
from router.routing.worker_state import prefill_load
from tests.router.test_redis_store import wait_until

A, B = b"replica-a", b"replica-b"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pair(ttl_s: float = 600.0) -> tuple[LoadTracker, LoadTracker, Clock]:
    """Replica a shares into b at once (the stream's delay is the tests' to place)."""
    clock = Clock()
    a, b = LoadTracker(clock=clock), LoadTracker(clock=clock, remote_ttl_s=ttl_s)
    for t in (a, b):
        t.add_worker("p0", "prefill", "m")
        t.add_worker("d0", "decode", "m")
    a.share = lambda share: b.remote(A, share)
    return a, b, clock


def report(tracker: LoadTracker, waiting_tokens: int, at: float, step: int = 0) -> None:
    load = WorkerLoad(
        "p0", "prefill", 0, 1, waiting_tokens, 10, 20, timestamp=at, steps=StepTotals(step)
    )
    tracker.report(load)


def route(a: LoadTracker, tokens: int):
    return a.start(a.workers["p0"], tokens, a.workers["d0"], 1)


def test_gated_and_admitted_work_of_another_replica_counts_until_done() -> None:
    a, b, clock = pair()
    p0 = b.workers["p0"]
    charge = route(a, 300)
    assert prefill_load(p0) == 300  # at a's gate: no report of the worker counts it
    clock.now += 1
    report(b, 0, at=clock.now)  # a report changes nothing for gated work
    assert prefill_load(p0) == 300
    clock.now += 1
    a.admit(charge)
    assert prefill_load(p0) == 300
    a.prefill_done(charge)
    assert prefill_load(p0) == 0
    a.close(charge)  # nothing more to tell
    assert prefill_load(p0) == 0 and len(p0.remote) == 0


def test_a_report_taken_after_the_admission_counts_it_instead() -> None:
    a, b, clock = pair()
    p0 = b.workers["p0"]
    charge = route(a, 200)
    a.admit(charge)
    clock.now += 0.05
    report(b, 200 + 70, at=clock.now)  # the worker has it, and 70 tokens of someone else
    assert prefill_load(p0) == 270
    a.prefill_done(charge)  # a charge no longer counted: nothing to take back
    assert prefill_load(p0) == 270
    report(b, 70, at=clock.now + 0.05)
    assert prefill_load(p0) == 70


def test_an_admission_heard_after_a_later_report_is_not_counted_twice() -> None:
    a, b, clock = pair()
    p0 = b.workers["p0"]
    late: list[LoadShare] = []
    a.share = late.append  # the stream delays a's shares
    charge = route(a, 120)
    a.admit(charge)
    report(b, 120, at=clock.now + 0.01)  # the worker counts it already
    for share in late:
        b.remote(A, share)
    assert prefill_load(p0) == 120


def test_a_finished_prefill_corrects_the_report_as_the_routing_replica_does() -> None:
    a, b, clock = pair()
    p0 = b.workers["p0"]
    charge = route(a, 50)
    a.admit(charge)
    report(a, 50, at=clock.now + 0.01, step=7)
    report(b, 50, at=clock.now + 0.01, step=7)  # both took the worker's report
    a.prefill_done(charge, (6, 9, 50))  # it reached the worker after step 6, ended at 9
    assert prefill_load(a.workers["p0"]) == prefill_load(p0) == 0


def test_a_gone_replicas_gated_work_expires() -> None:
    a, b, clock = pair(ttl_s=30)
    route(a, 400)  # a dies with it at its gate
    report(b, 0, at=clock.now + 10)
    assert prefill_load(b.workers["p0"]) == 400
    report(b, 0, at=clock.now + 31)
    assert prefill_load(b.workers["p0"]) == 0


def test_shares_for_unknown_workers_and_empty_charges_are_ignored() -> None:
    a, b, clock = pair()
    b.remote(A, LoadShare(1, "gone", 10, Stage.GATED, clock.now))
    told: list[LoadShare] = []
    a.share = told.append
    a.close(route(a, 0))  # a prompt its worker holds entirely: nothing to tell
    assert told == []
    assert prefill_load(b.workers["p0"]) == 0


def test_two_charges_of_two_replicas_are_kept_apart() -> None:
    _, b, clock = pair()
    p0 = b.workers["p0"]
    b.remote(B, LoadShare(0, "p0", 10, Stage.GATED, clock.now))
    b.remote(A, LoadShare(0, "p0", 20, Stage.GATED, clock.now))
    assert prefill_load(p0) == 30
    b.remote(A, LoadShare(0, "p0", 20, Stage.PREFILLED, clock.now))
    assert prefill_load(p0) == 10


def test_a_share_crosses_msgpack_unchanged() -> None:
    share = LoadShare(7, "p0", 33, Stage.PREFILLED, 12.5, (3, 4, 33))
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(share), type=LoadShare)
    assert back == share and back.stage is Stage.PREFILLED
    gated = LoadShare(8, "p0", 33, Stage.GATED, 12.5, None, 0.25)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(gated), type=LoadShare) == gated
    # a share from a replica that predates placed_s (one field fewer) still decodes
    old = msgspec.msgpack.encode([8, "p0", 33, 0, 12.5, None])
    assert msgspec.msgpack.decode(old, type=LoadShare).placed_s == 0.0


def two_replicas(url: str, policy: str = "cache_aware") -> list[Router]:
    ns = f"t{uuid.uuid4().hex[:8]}"
    routers = []
    for _ in range(2):
        store = RedisStore(url=url, namespace=ns, poll_ms=20, retry_s=0.05)
        config = RouterConfig(prefill_policy=policy, disagg_min_uncached_tokens=0)
        router = Router(config, store=store)
        for w in ("p0", "p1"):
            router.add_worker(w, "prefill", "m")
        router.add_worker("d0", "decode", "m")
        routers.append(router)
    for router in routers:  # each has its view (a replica that starts later hears nothing
        assert router.store.sync(10)  # of charges made before: the stream is not replayed)
    return routers


def test_router_replicas_on_redis_route_around_each_others_work(redis_server) -> None:
    a, b = two_replicas(redis_server.url)
    try:
        ticket = a.route("m", list(range(640)))  # 40 blocks nobody holds
        ticket.admit()
        busy = ticket.decision.prefill_worker_id
        assert a.store.sync(10) and b.store.sync(10)
        assert b.worker_load(busy)[0] == 640  # type: ignore[index]
        assert a.worker_load(busy)[0] == 640  # type: ignore[index]  # its own: not twice
        other = b.route("m", list(range(1000, 1160)))  # 10 other blocks: the idle worker
        assert other.decision.prefill_worker_id not in (None, busy)
        other.close()
        ticket.prefill_done()
        ticket.close()
        assert a.store.sync(10) and b.store.sync(10)
        assert b.worker_load(busy)[0] == 0  # type: ignore[index]
    finally:
        a.close()
        b.close()


def test_ttft_replicas_on_redis_balance_the_pool_s_placements(redis_server) -> None:
    """What one replica's ttft policy placed counts in the other's bounded load: after a's
    prefill is done (no queue anywhere), b's next prompt, which would tie, goes to the
    worker a did not load. Both replicas start their tie-break rotation at the same worker,
    so without the shared placements b would pick the one a picked."""
    a, b = two_replicas(redis_server.url, policy="ttft")
    try:
        first = a.route("m", list(range(640)))
        first.admit()
        first.prefill_done()
        first.close()
        assert a.store.sync(10) and b.store.sync(10)
        assert b.worker_load(first.decision.prefill_worker_id)[0] == 0  # type: ignore[index]
        second = b.route("m", list(range(5000, 5640)))  # no block in common
        second.close()
        assert second.decision.prefill_worker_id != first.decision.prefill_worker_id
    finally:
        a.close()
        b.close()


def test_after_a_redis_outage_the_others_charges_are_forgotten(own_redis) -> None:
    """Their ends may have been dropped while Redis was away: a charge that stays would
    weigh on its worker until the TTL."""
    a, b = two_replicas(own_redis.url)
    try:
        ticket = a.route("m", list(range(640)))  # waits at a's gate
        busy = ticket.decision.prefill_worker_id
        assert a.store.sync(10) and b.store.sync(10)
        assert b.worker_load(busy)[0] == 640  # type: ignore[index]
        own_redis.stop()
        assert wait_until(lambda: not b.store.healthy)
        ticket.close()  # its end is dropped with Redis away
        assert a.store.flush(10)
        own_redis.start()
        assert wait_until(lambda: b.store.healthy)
        assert b.worker_load(busy)[0] == 0  # type: ignore[index]
    finally:
        a.close()
        b.close()
