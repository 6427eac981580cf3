"""A worker's KV-event batches, kept for a while so that every front door reads all of them.

Several front doors (replicas on different hosts) poll the same workers. If a report handed
each batch out once, each replica would see only part of the cache events and route on a
wrong view. So the worker appends its batches here and a reader asks for those after the
last sequence number it applied; nothing is consumed. A reader whose next batch has already
been dropped (it fell behind the retention, or it is new to a worker with a long history)
gets a snapshot instead: `[AllBlocksCleared, BlockStored(the device's blocks), BlockTiered(
each offload tier's)]`, which replaces its view of the worker.

    seq:   ... 40 41 42 43 44        kept (at most `max_batches`)
    reader at 41 -> [42, 43, 44]     reader at 12 -> snapshot       reader at 44 -> []

Used on the worker's engine thread only (through AsyncEngine.call): no lock.
"""

from __future__ import annotations

import itertools
from collections import deque

from core.events import KVEventBatch


class EventLog:
    def __init__(self, max_batches: int = 1024) -> None:
        self._batches: deque[KVEventBatch] = deque(maxlen=max_batches)

    def append(self, batch: KVEventBatch) -> None:
        self._batches.append(batch)

    def since(self, after_seq: int) -> list[KVEventBatch] | None:
        """The batches after `after_seq` (-1: all of them from the first), in order; None
        when the next one the reader needs is no longer kept (it needs a snapshot)."""
        batches = self._batches
        if not batches or batches[-1].seq <= after_seq:
            return []
        first = batches[0].seq
        if after_seq + 1 < first:
            return None
        return list(itertools.islice(batches, after_seq + 1 - first, None))
