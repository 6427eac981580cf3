"""Promised blocks (router/routing/index/pending.py): a routed prefill's blocks count as its
worker's before its KV events report them, in this router and in its Redis replicas, and
stop counting when reported, removed, withdrawn or expired."""

from __future__ import annotations

import time
import uuid

from core.events import BlockRemoved, BlockStored, KVEventBatch, WorkerLoad
from core.hashing import hash_prompt_blocks, model_root_hash
from router.routing.index.pending import PendingBlocks
from router.routing.index.redis_store import RedisStore
from router.routing.route import Router, RouterConfig

TOKENS = list(range(160))  # 10 blocks of 16
HASHES = hash_prompt_blocks(TOKENS, 16, model_root_hash("m", 16))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_router(store=None, **cfg) -> tuple[Router, Clock]:
    router = Router(RouterConfig(disagg_min_uncached_tokens=0, **cfg), store=store)
    clock = Clock()
    router.store.clock = clock
    for w in ("p0", "p1"):
        router.add_worker(w, "prefill", "m")
    router.add_worker("d0", "decode", "m")
    return router, clock


def stored(worker: str, seq: int, hashes: list[int]) -> KVEventBatch:
    return KVEventBatch(worker, seq, [BlockStored(None, hashes)], model="m")


def test_promises_continue_each_workers_prefix_where_it_ends() -> None:
    pending = PendingBlocks()
    h = list(range(100, 108))
    pending.add("p0", h[3:5], now=0.0, ttl_s=10.0)
    pending.add("p1", h[:6], now=0.0, ttl_s=10.0)
    pending.add("p2", h[2:4], now=0.0, ttl_s=10.0)  # p2 holds nothing before block 2
    assert pending.extend(h, {"p0": 3}, now=1.0) == {"p0": 5, "p1": 6}
    cached = {"p3": 2}
    assert pending.extend(h[6:], cached, now=1.0) is cached  # nothing promised there
    pending.settle("p1", h[2:3])  # reported: the promise past it still counts only from 3
    assert pending.extend(h, {"p1": 2}, now=1.0) == {"p1": 2}
    assert pending.extend(h, {}, now=1.0) == {"p1": 2}
    assert pending.extend(h, {}, now=10.0) == {}  # expired
    assert len(pending) == 0


def test_a_renewal_does_not_promise_blocks_reported_since() -> None:
    pending = PendingBlocks()
    pending.add("p0", [1, 2, 3], now=0.0, ttl_s=600.0)
    pending.settle("p0", [1, 2])
    pending.add("p0", [1, 2, 3], now=1.0, ttl_s=5.0, renew=True)
    assert pending.extend([1, 2, 3], {"p0": 2}, now=2.0) == {"p0": 3}
    assert pending.extend([1, 2, 3], {}, now=2.0) == {}  # 1 and 2 are not promises again
    assert pending.extend([1, 2, 3], {"p0": 2}, now=6.5) == {"p0": 2}  # the shorter life


def test_settled_promises_do_not_pile_up_until_their_deadline() -> None:
    pending = PendingBlocks()
    for i in range(20_000):
        pending.add("p0", [i], now=0.0, ttl_s=600.0)
        pending.settle("p0", [i])
    assert len(pending) == 0 and len(pending._expiry) < 8192


def test_a_burst_of_one_prefix_goes_where_it_is_being_computed() -> None:
    for ttl in (600.0, 0.0):
        router, _ = make_router(pending_ttl_s=ttl)
        router.report_load(WorkerLoad("p0", "prefill", 0, 1, 100, 1000, 1000))
        first = router.route("m", TOKENS)
        assert first.decision.prefill_worker_id == "p1"  # the shorter queue
        second = router.route("m", TOKENS)  # before any event of the first prefill
        if ttl:  # it finds the prefix computed when its turn comes behind the first
            assert second.decision.prefill_worker_id == "p1"
            assert second.decision.prefill_cached_blocks == 10
            assert second.prefill_tokens == 0
        else:  # a miss everywhere: recomputed on the worker with less queued
            assert second.decision.prefill_worker_id == "p0"
            assert second.decision.prefill_cached_blocks == 0


def test_reported_removed_withdrawn_or_expired_promises_end() -> None:
    router, clock = make_router()
    ticket = router.route("m", TOKENS)
    p = ticket.decision.prefill_worker_id
    assert p is not None
    assert router.store.longest_prefixes("m", HASHES)[:2] == ({}, {p: 10})
    # done: still promised a few seconds, for the events on their way
    ticket.prefill_done()
    ticket.close()
    clock.t += 4.0
    assert router.store.longest_prefixes("m", HASHES)[:2] == ({}, {p: 10})
    clock.t += 2.0
    assert router.store.longest_prefixes("m", HASHES)[:2] == ({}, {})
    # reported: a cached block from then on; its eviction removes it like any other
    again = router.route("m", TOKENS)
    q = again.decision.prefill_worker_id
    assert q is not None
    router.apply(stored(q, 0, HASHES[:4]))
    router.apply(KVEventBatch(q, 1, [BlockRemoved(HASHES[2:4])], model="m"))
    assert router.store.longest_prefixes("m", HASHES)[:2] == ({q: 2}, {q: 2})
    again.close()
    # closed without a prefill: withdrawn at once
    tokens = list(range(500, 660))
    hashes = hash_prompt_blocks(tokens, 16, model_root_hash("m", 16))
    other = router.route("m", tokens)
    assert router.store.longest_prefixes("m", hashes)[1] == {other.decision.prefill_worker_id: 10}
    other.close()
    assert router.store.longest_prefixes("m", hashes)[1] == {}
    # never heard of again: expires after the long deadline
    tokens = list(range(900, 1060))
    hashes = hash_prompt_blocks(tokens, 16, model_root_hash("m", 16))
    lost = router.route("m", tokens)
    clock.t += 599.0
    assert router.store.longest_prefixes("m", hashes)[1] != {}
    clock.t += 2.0
    assert router.store.longest_prefixes("m", hashes)[1] == {}
    lost.close()


def test_a_worker_that_leaves_takes_its_promises() -> None:
    router, _ = make_router()
    p = router.route("m", TOKENS).decision.prefill_worker_id
    assert p is not None
    router.remove_worker(p)
    assert router.store.longest_prefixes("m", HASHES)[:2] == ({}, {})


def test_a_pull_is_only_offered_from_reported_blocks() -> None:
    router, _ = make_router(
        prefill_policy="ttft",
        prefill_policy_args={"kv_bytes_per_token": 1000.0, "transfer_gbps": 10.0},
    )
    first = router.route("m", TOKENS)
    assert first.decision.pull_from is None
    # p's promised blocks are no source to copy from: nothing of them exists yet
    for _ in range(6):
        assert router.route("m", TOKENS).decision.pull_from is None


def test_replicas_see_each_others_promises_and_withdrawals(redis_server) -> None:
    ns = f"t{uuid.uuid4().hex[:8]}"
    stores = [RedisStore(url=redis_server.url, namespace=ns, poll_ms=20) for _ in range(2)]
    (a, _), (b, _) = make_router(stores[0]), make_router(stores[1])
    try:
        assert a.store.sync(10) and b.store.sync(10)
        ticket = a.route("m", TOKENS)
        p = ticket.decision.prefill_worker_id
        assert a.store.sync(10) and b.store.sync(10)
        # b counts a's prefill as p's queued work too (router.routing.load_share): with the
        # other worker idle the two costs tie, so the other one is made busy
        other = "p0" if p == "p1" else "p1"
        b.report_load(WorkerLoad(other, "prefill", 1, 1, 10_000, 10, 20, timestamp=time.time()))
        seen = b.route("m", TOKENS)
        assert seen.decision.prefill_worker_id == p
        assert seen.decision.prefill_cached_blocks == 10
        seen.close()  # b's withdrawal of its own (empty) promise changes nothing
        ticket.close()  # a withdraws: b hears it
        assert a.store.sync(10) and b.store.sync(10)
        assert b.store.longest_prefixes("m", HASHES)[:2] == ({}, {})
    finally:
        a.close()
        b.close()
