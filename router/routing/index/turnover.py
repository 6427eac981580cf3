"""How fast each worker's prefix cache turns over, from its KV events alone.

An LRU cache of K blocks evicts, next, the block it stored longest ago among its K latest
(hits refresh blocks too, but they send no event). So the age of a worker's LRU tail is
about the time since it stored its K-th latest block, with K the blocks the index lists for
it. A cache whose tail is old turns over slowly: what it evicts next has gone unused longer
and (the LRU characteristic-time model) is less likely to be asked for again. The `ttft`
policy weighs the reuse a placement destroys by it (router/routing/policies/ttft/cost.py): the
pooled-LRU oracle evicts the oldest blocks of the whole pool, and storing new blocks where
the tail is oldest does the same across workers.

Per worker a log of (time, blocks stored) per event batch, trimmed to the batches that hold
its K latest blocks: memory grows with the batches in one turnover, not with time.
"""

from __future__ import annotations

from collections import deque


class Turnover:
    def __init__(self) -> None:
        self._log: dict[str, deque[tuple[float, int]]] = {}
        self._total: dict[str, int] = {}
        """Blocks in each worker's log."""
        self._tail: dict[str, float] = {}
        """When each worker stored the oldest of the blocks it holds, where the log knows:
        kept as batches arrive, so a routing decision only subtracts (`tail_ages`)."""

    def applied(self, worker_id: str, num_stored: int, now: float, held: int) -> None:
        """A batch of the worker's events: it stored `num_stored` blocks at `now` and holds
        `held` blocks since (stores and removals both move its tail)."""
        log = self._log.get(worker_id)
        if num_stored > 0:
            if log is None:
                log = self._log[worker_id] = deque()
            log.append((now, num_stored))
            self._total[worker_id] = self._total.get(worker_id, 0) + num_stored
        if log is None:
            return
        total = self._total[worker_id]
        while len(log) > 1 and total - log[0][1] >= held:
            total -= log.popleft()[1]
        self._total[worker_id] = total
        if held > 0 and total >= held:
            self._tail[worker_id] = log[0][0]
        else:  # it never stored that many: a cache that never filled evicts nothing
            self._tail.pop(worker_id, None)

    def tail_ages(self, now: float) -> dict[str, float]:
        """Seconds since each worker stored the oldest of the blocks it holds, where known."""
        return {w: max(0.0, now - t) for w, t in self._tail.items()}

    def forget(self, worker_id: str) -> None:
        """The worker left, or its cache was cleared: its history says nothing now."""
        self._log.pop(worker_id, None)
        self._total.pop(worker_id, None)
        self._tail.pop(worker_id, None)
