"""The engine's KV-cache events as numbered batches: what its prefix cache stored and
evicted since the last batch, or a snapshot of all of it (core.events; the router's index
applies them in sequence order and asks for a snapshot when it missed one)."""

from __future__ import annotations

import time

from core.events import AllBlocksCleared, BlockStored, BlockTiered, KVEvent, KVEventBatch
from engine.kv_cache.block_pool import BlockPool


class KVEventFeed:
    def __init__(self, worker_id: str, model_id: str) -> None:
        self.worker_id = worker_id
        self.model_id = model_id
        self.seq = 0

    def take(self, pool: BlockPool) -> KVEventBatch | None:
        """The pool's events since the last batch; None when there are none."""
        events: list[KVEvent] = pool.take_events()
        if self.seq == 0:
            events.insert(0, AllBlocksCleared())  # a (re)started worker's view begins empty
        elif not events:
            return None
        return self._batch(events)

    def snapshot(self, pool: BlockPool) -> KVEventBatch:
        """Everything the pool caches, as one batch that replaces the receiver's view."""
        pool.take_events()  # superseded by the snapshot
        hashes = pool.device_hashes()
        events: list[KVEvent] = [AllBlocksCleared()]
        if hashes:
            events.append(BlockStored(parent=None, block_hashes=hashes))
        for tier, tiered in enumerate(pool.tiered_hashes(), start=1):
            if tiered:
                events.append(BlockTiered(block_hashes=tiered, tier=tier))
        return self._batch(events)

    def _batch(self, events: list[KVEvent]) -> KVEventBatch:
        batch = KVEventBatch(
            worker_id=self.worker_id,
            seq=self.seq,
            events=events,
            timestamp=time.time(),
            model=self.model_id,
        )
        self.seq += 1
        return batch
