"""Where the prefix index lives and how KV events reach it: one small interface, two stores.

    IndexStore
      publish(batch)          a worker's KV events enter the shared view (may be asynchronous)
      remove_worker(m, w)     a worker left: its entries leave every replica's view
      read(model)             context manager: the local PrefixIndex, locked for reading,
                              or None when the view cannot be trusted (degraded store)
      longest_prefixes(m, h)  read(m) + PrefixIndex.longest_prefixes(h), the routing fast path
      sync(timeout)           block until everything published so far is in the local view
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from core.events import KVEventBatch
from router.routing.index.prefix_index import ApplyOutcome, PrefixIndex

ResyncCallback = Callable[[str, str], None]
"""on_resync(model, worker_id)."""


class IndexStore(abc.ABC):
    """Owns the per-model PrefixIndex objects and the lock guarding them."""

    def __init__(self, on_resync: ResyncCallback | None = None) -> None:
        self._on_resync = on_resync
        self._lock = threading.Lock()
        self._indexes: dict[str, PrefixIndex] = {}

    def set_resync_callback(self, on_resync: ResyncCallback | None) -> None:
        self._on_resync = on_resync

    def _index(self, model: str) -> PrefixIndex:
        """The model's index, created on first use. Caller holds the lock."""
        index = self._indexes.get(model)
        if index is None:
            index = self._indexes[model] = PrefixIndex(model)
        return index

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

    def longest_prefixes(self, model: str, block_hashes: Sequence[int]) -> dict[str, int] | None:
        """`read(model)` + `PrefixIndex.longest_prefixes` in one call, for the decision path
        (no generator-based context manager): None when degraded."""
        with self._lock:
            if not self.healthy:
                return None
            index = self._indexes.get(model)
            return index.longest_prefixes(block_hashes) if index is not None else {}

    def block_counts(self, model: str) -> dict[str, int] | None:
        """Blocks each worker's cache holds, per the local view (None when degraded)."""
        with self._lock:
            if not self.healthy:
                return None
            index = self._indexes.get(model)
            return index.block_counts() if index is not None else {}

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

    def close(self) -> None:
        return None


class InProcessStore(IndexStore):
    """The embedded default: events are applied on the caller's thread, under the lock."""

    def publish(self, batch: KVEventBatch) -> None:
        with self._lock:
            outcome = self._index(batch.model).apply(batch)
        self._report(batch.model, batch.worker_id, outcome)

    def remove_worker(self, model: str, worker_id: str) -> None:
        with self._lock:
            self._index(model).remove_worker(worker_id)
