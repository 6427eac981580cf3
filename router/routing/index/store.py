"""Where the prefix index lives and how KV events reach it: one small interface, two stores.

    IndexStore
      publish(batch)          a worker's KV events enter the shared view (may be asynchronous)
      remove_worker(m, w)     a worker left: its entries leave every replica's view
      read(model)             context manager: the local PrefixIndex, locked for reading,
                              or None when the view cannot be trusted (degraded store)
      longest_prefixes(m, h)  read(m) + PrefixIndex.longest_prefixes(h), the routing fast path:
                              as reported, extended by the blocks promised (pending.py),
                              and the part of each an offload tier holds (Prefixes)
      promise(m, w, h, ttl)   a decision sent a prefill of these blocks to w; count them as
                              w's for `ttl` seconds (shared by replicas)
      request_resync(m, w)    have w's entry rebuilt from its snapshot (on_resync)
      sync(timeout)           block until everything published so far is in the local view
      share_load(s)           tell the other replicas of a charge's prefill stage, if any
                              (router.routing.load_share); theirs reach on_load_share
      close()                 stop background work; called exactly once by the owner

`InProcessStore` (the embedded default) applies events synchronously under one lock.
`RedisStore` (redis_store.py) sends them through a Redis stream and applies them from a
background thread, so several router replicas share one view and the decision path never
waits on Redis I/O.

Every store calls `on_resync(model, worker_id)` when a worker's view must be rebuilt from a
snapshot (gap, regression, unknown worker); the cluster answers by asking that worker for
a batch `[AllBlocksCleared(), BlockStored(None, hashes), ...]` and publishing it.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import NamedTuple

from core.events import AllBlocksCleared, BlockRemoved, BlockStored, BlockTiered, KVEventBatch
from router.routing.index.pending import PendingBlocks
from router.routing.index.prefix_index import ApplyOutcome, PrefixIndex
from router.routing.index.turnover import Turnover
from router.routing.load_share import LoadShare

ResyncCallback = Callable[[str, str], None]
"""on_resync(model, worker_id)."""
LoadShareCallback = Callable[[list[tuple[bytes, LoadShare]], bool], None]
"""on_load_share([(replica, share), ...], forget): other replicas' charges, in their order;
`forget`: first drop every one heard before (the stream broke off, their ends may be lost)."""

_NONE: Mapping[str, Sequence[int]] = MappingProxyType({})


class Prefixes(NamedTuple):
    """The longest cached prefix of a prompt on each worker (workers with none left out)."""

    reported: Mapping[str, int]
    """As the workers' KV events reported it."""
    cached: Mapping[str, int]
    """The same, extended by blocks promised to the worker (the same object when none)."""
    offloaded: Mapping[str, Sequence[int]] = _NONE
    """Of each reported prefix, the blocks only an offload tier holds, per tier (host,
    disk): a copy back each, not a read in place. Workers with none are left out."""


class IndexStore(abc.ABC):
    """Owns the per-model PrefixIndex objects and the lock guarding them."""

    def __init__(self, on_resync: ResyncCallback | None = None) -> None:
        self._on_resync = on_resync
        self._on_load_share: LoadShareCallback | None = None
        self._lock = threading.Lock()
        self._indexes: dict[str, PrefixIndex] = {}
        self._pending: dict[str, PendingBlocks] = {}
        self._turnover: dict[str, Turnover] = {}
        self.clock: Callable[[], float] = time.monotonic
        """Seconds, for the promises' lifetimes (a simulator replaces it with its own)."""

    def set_resync_callback(self, on_resync: ResyncCallback | None) -> None:
        self._on_resync = on_resync

    def request_resync(self, model: str, worker_id: str) -> None:
        """Have the worker's entry rebuilt from its snapshot, as after a gap in its events
        (the router found the entry untrue: router.routing.accuracy)."""
        if self._on_resync is not None:
            self._on_resync(model, worker_id)

    def _index(self, model: str) -> PrefixIndex:
        """The model's index, created on first use. Caller holds the lock."""
        index = self._indexes.get(model)
        if index is None:
            index = self._indexes[model] = PrefixIndex(model)
        return index

    def _promise(
        self, model: str, worker_id: str, hashes: Sequence[int], ttl_s: float, renew: bool
    ) -> None:
        """Record a promise locally. Caller holds the lock."""
        pending = self._pending.get(model)
        if pending is None:
            pending = self._pending[model] = PendingBlocks()
        pending.add(worker_id, hashes, self.clock(), ttl_s, renew)

    def _applied(self, batch: KVEventBatch, outcome: ApplyOutcome) -> None:
        """A batch was applied: the blocks it stored are no longer promises, nor those it
        removed (a late removal may void a promise made since: the view then under-counts,
        as a stale index does, rather than over-counts); what it stored counts in the
        worker's turnover, unless it opens a snapshot or the view was purged (a
        snapshot's blocks were stored at other times). Caller holds the lock."""
        model, worker_id = batch.model, batch.worker_id
        pending = self._pending.get(model)
        if pending is not None:
            for event in batch.events:
                if isinstance(event, (BlockStored, BlockTiered, BlockRemoved)):
                    pending.settle(worker_id, event.block_hashes)
        turnover = self._turnover.get(model)
        if turnover is None:
            turnover = self._turnover[model] = Turnover()
        if outcome is not ApplyOutcome.APPLIED or (
            batch.events and isinstance(batch.events[0], AllBlocksCleared)
        ):
            if outcome is not ApplyOutcome.DUPLICATE:
                turnover.forget(worker_id)
            return
        stored = sum(len(e.block_hashes) for e in batch.events if isinstance(e, BlockStored))
        held = self._index(model).num_blocks(worker_id)
        turnover.applied(worker_id, stored, self.clock(), held)

    def _forget(self, model: str, worker_id: str) -> None:
        """The worker left: its index entries and promises go. Caller holds the lock."""
        self._index(model).remove_worker(worker_id)
        pending = self._pending.get(model)
        if pending is not None:
            pending.drop_worker(worker_id)
        turnover = self._turnover.get(model)
        if turnover is not None:
            turnover.forget(worker_id)

    def promise(
        self,
        model: str,
        worker_id: str,
        hashes: Sequence[int],
        ttl_s: float,
        renew: bool = False,
    ) -> None:
        """A routing decision sent the prefill of `hashes` to `worker_id`: until its events
        report them, or for `ttl_s`, count them as that worker's (pending.py); a promise of
        the same blocks made before gets this lifetime instead (0: it ends; `renew`: only
        blocks still promised)."""
        with self._lock:
            self._promise(model, worker_id, hashes, ttl_s, renew)

    def _report(self, model: str, worker_id: str, outcome: ApplyOutcome) -> None:
        if outcome.needs_resync and self._on_resync is not None:
            self._on_resync(model, worker_id)

    @property
    def healthy(self) -> bool:
        """False while the local view cannot be trusted; routing then goes by load alone."""
        return True

    @contextmanager
    def read(self, model: str) -> Iterator[PrefixIndex | None]:
        """The model's index, locked for the duration of the block (None when degraded)."""
        with self._lock:
            yield self._index(model) if self.healthy else None

    def longest_prefixes(self, model: str, block_hashes: Sequence[int]) -> Prefixes | None:
        """`read(model)` + `PrefixIndex.longest_prefixes` in one call, for the decision path
        (no generator-based context manager); None when degraded."""
        with self._lock:
            if not self.healthy:
                return None
            index = self._indexes.get(model)
            reported: Mapping[str, int] = {}
            offloaded = _NONE
            if index is not None:
                reported = index.longest_prefixes(block_hashes)
                offloaded = index.offloaded_blocks(block_hashes, reported) or _NONE
            pending = self._pending.get(model)
            if pending is None:
                return Prefixes(reported, reported, offloaded)
            extended = pending.extend(block_hashes, reported, self.clock())
            return Prefixes(reported, extended, offloaded)

    def cache_views(self, model: str) -> tuple[dict[str, int], dict[str, float]] | None:
        """Blocks each worker's cache holds, and the age of its LRU tail in seconds where
        known (turnover.py), per the local view; None when degraded."""
        with self._lock:
            if not self.healthy:
                return None
            index = self._indexes.get(model)
            if index is None:
                return {}, {}
            turnover = self._turnover.get(model)
            ages = turnover.tail_ages(self.clock()) if turnover is not None else {}
            return index.block_counts(), ages

    @abc.abstractmethod
    def publish(self, batch: KVEventBatch) -> None: ...

    @abc.abstractmethod
    def remove_worker(self, model: str, worker_id: str) -> None: ...

    def add_worker(self, model: str, worker_id: str) -> None:
        """A worker joined: give it a slot and ask for its cache (we know nothing of it)."""
        with self._lock:
            added = self._index(model).add_worker(worker_id)
        if added and self._on_resync is not None:
            self._on_resync(model, worker_id)

    def sync(self, timeout: float = 5.0) -> bool:
        """True once every batch published before the call is in the local view."""
        return True

    shares_load = False
    """Whether other router replicas may route beside this one (share_load reaches them)."""

    def share_load(self, share: LoadShare) -> None:
        """Tell the other replicas (none here). Must not block: called under the router's
        lock."""
        return None

    def set_load_share_callback(self, on_load_share: LoadShareCallback | None) -> None:
        """Where other replicas' shares go; called without the store's lock held."""
        self._on_load_share = on_load_share

    def close(self) -> None:
        return None


class InProcessStore(IndexStore):
    """The embedded default: events are applied on the caller's thread, under the lock."""

    def publish(self, batch: KVEventBatch) -> None:
        with self._lock:
            outcome = self._index(batch.model).apply(batch)
            self._applied(batch, outcome)
        self._report(batch.model, batch.worker_id, outcome)

    def remove_worker(self, model: str, worker_id: str) -> None:
        with self._lock:
            self._forget(model, worker_id)
