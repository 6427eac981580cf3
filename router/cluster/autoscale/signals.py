"""What the autoscaler reads, per pool: the workers' loads (the controller asks them) and the
front doors' reports (each door pushes its own: the queues only it holds, and the TTFT / ITL
its clients saw).

Busy share comes from the workers' step totals (core/step_stats.py): time spent stepping
between two loads over the wall time between them, so it needs two reads of a worker.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from core.events import WorkerLoad
from core.roles import WorkerRole
from router.cluster.autoscale.policy import PoolSignals


class WaitBook:
    """Requests waiting at a front door for something a pool lacks (a prefill worker's
    admission, a decode worker's free blocks): how many, and since when."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}
        self._keys = itertools.count()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        key = next(self._keys)
        self._since[key] = time.monotonic()
        try:
            yield
        finally:
            del self._since[key]

    def stats(self) -> tuple[int, float]:
        """(waiting, the oldest one's wait in seconds)."""
        if not self._since:
            return 0, 0.0
        return len(self._since), time.monotonic() - min(self._since.values())


@dataclass(frozen=True)
class DoorReport:
    """One front door's view, pushed to the controller with every membership poll."""

    door_id: str
    at: float
    """time.time() when made (reports older than a few periods are dropped)."""
    ttft_p90_s: float | None
    itl_p90_s: float | None
    waiting: dict[str, tuple[int, float]] = field(default_factory=dict)
    """pool -> (requests waiting at this door for it, oldest wait in seconds)."""


def door_report(door_id: str, slo: Any | None, waits: dict[str, WaitBook]) -> DoorReport:
    """`slo`: the door's router.frontdoor.slo_window.SloWindow (None: no latencies yet)."""
    ttft, itl = slo.percentiles(0.9) if slo is not None else (None, None)
    return DoorReport(door_id, time.time(), ttft, itl, {p: w.stats() for p, w in waits.items()})


class SignalCollector:
    def __init__(self, stale_after_s: float = 10.0) -> None:
        self.stale_after_s = stale_after_s
        self.doors: dict[str, DoorReport] = {}
        self._last: dict[str, WorkerLoad] = {}

    def add_door(self, report: DoorReport) -> None:
        self.doors[report.door_id] = report

    def busy(self, load: WorkerLoad) -> float:
        """Share of wall time the worker stepped since its previous load (0 on the first)."""
        prev = self._last.get(load.worker_id)
        self._last[load.worker_id] = load
        if prev is None or load.timestamp <= prev.timestamp:
            return 0.0
        stepped = load.steps.busy_s() - prev.steps.busy_s()
        return max(0.0, min(1.0, stepped / (load.timestamp - prev.timestamp)))

    def pools(
        self,
        sizes: dict[str, int],
        starting: dict[str, int],
        loads: list[tuple[str, WorkerLoad]],
    ) -> dict[str, PoolSignals]:
        """Each pool's signals from its workers' loads ((pool, load) of every ready worker
        that answered: the pool, not the load's role, which is the engine's, `unified` on a
        decode worker) and the doors' fresh reports."""
        now = time.time()
        self.doors = {d: r for d, r in self.doors.items() if now - r.at < self.stale_after_s}
        alive = {load.worker_id for _, load in loads}
        self._last = {w: load for w, load in self._last.items() if w in alive}
        ttfts = [r.ttft_p90_s for r in self.doors.values() if r.ttft_p90_s is not None]
        itls = [r.itl_p90_s for r in self.doors.values() if r.itl_p90_s is not None]
        out = {}
        for pool in sizes:
            mine = [load for role, load in loads if role == pool]
            busy = [self.busy(load) for load in mine]
            at_doors = [r.waiting.get(pool, (0, 0.0)) for r in self.doors.values()]
            out[pool] = PoolSignals(
                ready=len(mine),
                starting=starting.get(pool, 0),
                queued=sum(load.num_waiting for load in mine) + sum(n for n, _ in at_doors),
                oldest_wait_s=max(
                    [load.oldest_wait_s for load in mine] + [w for _, w in at_doors] + [0.0]
                ),
                ttft_p90_s=max(ttfts) if ttfts and pool != WorkerRole.DECODE else None,
                itl_p90_s=max(itls) if itls and pool != WorkerRole.PREFILL else None,
                kv_usage=sum(load.kv_usage for load in mine) / len(mine) if mine else 0.0,
                busy=sum(busy) / len(busy) if busy else 0.0,
            )
        return out
