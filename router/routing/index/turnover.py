"""How fast each worker's prefix cache turns over, from its KV events alone.

An LRU cache of K blocks evicts, next, the block it stored longest ago among its K latest
(hits refresh blocks too, but they send no event). So the age of a worker's LRU tail is
about the time since it stored its K-th latest block, with K the blocks the index lists for
it. A cache whose tail is old turns over slowly: what it evicts next has gone unused longer
and (the LRU characteristic-time model) is less likely to be asked for again. The `ttft`
policy weighs the reuse a placement destroys by it (router/routing/policies/ttft.py): the
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

    def stored(self, worker_id: str, num_blocks: int, now: float, held: int) -> None:
        """The worker stored `num_blocks` at `now` and holds `held` blocks since."""
        if num_blocks <= 0:
            return
        log = self._log.setdefault(worker_id, deque())
        log.append((now, num_blocks))
        self._total[worker_id] = self._total.get(worker_id, 0) + num_blocks
        self._trim(worker_id, held)

    def tail_age(self, worker_id: str, held: int, now: float) -> float | None:
        """Seconds since the worker stored the oldest of its `held` latest blocks; None until
        its log covers that many (a cache that never filled evicts nothing)."""
        log = self._log.get(worker_id)
        if not log or held <= 0:
            return None
        self._trim(worker_id, held)
        if self._total[worker_id] < held:
            return None
        return max(0.0, now - log[0][0])

    def forget(self, worker_id: str) -> None:
        """The worker left, or its cache was cleared: its history says nothing now."""
        self._log.pop(worker_id, None)
        self._total.pop(worker_id, None)

    def _trim(self, worker_id: str, held: int) -> None:
        log, total = self._log[worker_id], self._total[worker_id]
        while len(log) > 1 and total - log[0][1] >= held:
            total -= log.popleft()[1]
        self._total[worker_id] = total
