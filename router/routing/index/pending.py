"""Blocks routed to a worker that its KV events have not reported yet: the router's promises.

A worker reports a block (BlockStored) when its engine schedules the request that computes
it, which can be a whole queue wait (at the router's prefill gate, then in the engine)
after that request was routed. In that window the index says nobody holds the prompt, so
a second request with the same prefix (a burst of one system prompt, or the next turn of a
conversation) is routed as if it were new: by load, to another worker that computes the
prefix a second time. With several router replicas the window also covers the other
replicas' decisions, which they learn about only through the workers' events.

So every routing decision records the blocks its prefill worker will store (the prompt's
blocks past what that worker already holds), and the index's longest prefixes are extended
by them:

    cached  (events)      p0: 3          p1: 0
    pending (decisions)   p0: h3 h4      p1: h0 h1 h2 h3 h4 h5
    extended              p0: 5          p1: 6

A pending block continues a worker's prefix only where its prefix ends (block i counts for
w when w holds exactly blocks 0..i-1), as a cached one would. The engine admits a worker's
requests in order and names a request's blocks in its prefix cache when it schedules it,
so a request sent after the promising one hits them.

A promise ends when the worker's events report the block stored (it is a cached block from
then on, removed by its eviction event like any other) or removed (an eviction reported
late may end a newer promise: the view then under-counts, as a stale index does, and never
over-counts), when the worker leaves, or at its deadline. The router gives each promise a
long deadline when it routes (`ttl_s`, a backstop for messages lost), shortens it to a few
seconds once the prefill is done (its events are due; `renew`: blocks already reported are
not promised again) and ends it when the request ends without a prefill (ttl 0); each of
these is one `add` with the new lifetime, here and, for a shared store, in every replica.
Expiry is lazy: a heap of deadlines, where an entry whose block was re-promised since is
skipped.

Not thread-safe: the index store calls it under its lock.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence

DEFAULT_TTL_S = 600.0
"""A promise's lifetime while its request waits and prefills."""
DEFAULT_GRACE_S = 5.0
"""Its lifetime once the prefill is done, for the events to arrive."""


class _Promise:
    """One `add`: its blocks still pointing at it are `open`; with none it is garbage."""

    __slots__ = ("deadline", "hashes", "open", "worker_id")

    def __init__(self, worker_id: str, hashes: Sequence[int], deadline: float) -> None:
        self.worker_id = worker_id
        self.hashes = hashes
        self.deadline = deadline
        self.open = 0


class PendingBlocks:
    """The promises of one model: block hash -> {worker: the promise that holds it}."""

    __slots__ = ("_by_hash", "_compact_at", "_expiry", "_seq")

    def __init__(self) -> None:
        self._by_hash: dict[int, dict[str, _Promise]] = {}
        # (deadline, tie-break, promise): a min-heap of deadlines
        self._expiry: list[tuple[float, int, _Promise]] = []
        self._seq = itertools.count()
        self._compact_at = 4096

    def __len__(self) -> int:
        """Promised (block, worker) pairs still open."""
        return sum(len(w) for w in self._by_hash.values())

    def add(
        self,
        worker_id: str,
        hashes: Sequence[int],
        now: float,
        ttl_s: float,
        renew: bool = False,
    ) -> None:
        """`worker_id` will store `hashes` (a run of a prompt's chain) within `ttl_s`; a
        promise of the same blocks made before gets this lifetime instead (0: it ends).
        `renew`: only blocks still promised get the new lifetime (a block reported since
        is not promised again)."""
        if not hashes:
            return
        self.expire(now)
        if ttl_s <= 0:
            self.settle(worker_id, hashes)
            return
        promise = _Promise(worker_id, hashes, now + ttl_s)
        by_hash = self._by_hash
        for h in hashes:
            workers = by_hash.get(h)
            if workers is None:
                if renew:
                    continue
                workers = by_hash[h] = {}
            old = workers.get(worker_id)
            if old is None:
                if renew:
                    continue
            else:
                old.open -= 1
            workers[worker_id] = promise
            promise.open += 1
        if promise.open:
            heapq.heappush(self._expiry, (promise.deadline, next(self._seq), promise))
            if len(self._expiry) >= self._compact_at:
                # most promises settle long before their deadline: the heap must not keep
                # every request of the last `ttl_s`
                self._expiry = [e for e in self._expiry if e[2].open]
                heapq.heapify(self._expiry)
                self._compact_at = max(4096, 2 * len(self._expiry))

    def settle(self, worker_id: str, hashes: Iterable[int]) -> None:
        """The worker reported these blocks stored (or removed): they are no longer promises."""
        by_hash = self._by_hash
        if not by_hash:
            return
        get = by_hash.get
        for h in hashes:
            workers = get(h)
            if workers is not None:
                promise = workers.pop(worker_id, None)
                if promise is not None:
                    promise.open -= 1
                    if not workers:
                        del by_hash[h]

    def drop_worker(self, worker_id: str) -> None:
        for h in [h for h, workers in self._by_hash.items() if worker_id in workers]:
            self.settle(worker_id, (h,))

    def expire(self, now: float) -> None:
        expiry, by_hash = self._expiry, self._by_hash
        while expiry and expiry[0][0] <= now:
            promise = heapq.heappop(expiry)[2]
            if not promise.open:
                continue
            worker_id = promise.worker_id
            for h in promise.hashes:
                workers = by_hash.get(h)
                # a block promised again since belongs to the newer promise
                if workers is not None and workers.get(worker_id) is promise:
                    del workers[worker_id]
                    if not workers:
                        del by_hash[h]
            promise.open = 0

    def extend(
        self, hashes: Sequence[int], cached: Mapping[str, int], now: float
    ) -> Mapping[str, int]:
        """`cached` (worker -> longest cached prefix of `hashes`, in blocks) with every
        worker's prefix continued through the blocks promised to it. Returns `cached`
        itself when no promise extends anything."""
        self.expire(now)
        by_hash = self._by_hash
        if not by_hash:
            return cached
        out: dict[str, int] | None = None
        reach = max(cached.values(), default=0)  # past it, only promises extend prefixes
        for i, h in enumerate(hashes):
            workers = by_hash.get(h)
            if workers is None:
                if i >= reach:
                    break
                continue
            for w in workers:
                if (cached if out is None else out).get(w, 0) == i:
                    if out is None:
                        out = dict(cached)
                    out[w] = i + 1
                    reach = max(reach, i + 1)
        return cached if out is None else out
