"""What the autoscaler reads, per pool: the workers' loads (the controller asks them) and the
front doors' reports (each door pushes its own: the queues only it holds, and the TTFT / ITL
its clients saw).

Busy share and work come from the workers' step totals (core/step_stats.py): time spent
stepping, and prompt tokens plus decode rows, between two loads over the wall time between
them, so they need two reads of a worker. The batch's growth is the slope of the pool's
batch usage over its last `TREND_LOOKS` looks (least squares), what the policy's lead term
extrapolates.
"""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from core.events import WorkerLoad
from core.roles import WorkerRole
from router.cluster.autoscale.policy import PoolSignals

TREND_LOOKS = 8


def slope(points: collections.abc.Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points; 0 for fewer than two distinct times."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / var


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
    prefill_ttft_p90_s: float | None = None
    """TTFT p90 of the requests a prefill pool prefilled (the rest were prefilled by the
    worker that decoded them)."""


def door_report(door_id: str, slo: Any | None, waits: dict[str, WaitBook]) -> DoorReport:
    """`slo`: the door's router.frontdoor.slo_window.SloWindow (None: no latencies yet)."""
    ttft, itl = slo.percentiles(0.9) if slo is not None else (None, None)
    waiting = {p: w.stats() for p, w in waits.items()}
    prefill_ttft = slo.prefill_pool_ttft(0.9) if slo is not None else None
    return DoorReport(door_id, time.time(), ttft, itl, waiting, prefill_ttft)


class SignalCollector:
    def __init__(self, stale_after_s: float = 10.0) -> None:
        self.stale_after_s = stale_after_s
        self.doors: dict[str, DoorReport] = {}
        self._last: dict[str, WorkerLoad] = {}
        self._batch: dict[str, collections.deque[tuple[float, float]]] = {}

    def add_door(self, report: DoorReport) -> None:
        self.doors[report.door_id] = report

    def rates(self, load: WorkerLoad) -> tuple[float, float]:
        """Since the worker's previous load (0s on the first): the share of wall time it
        stepped, and its tokens through the model (prompt tokens + decode rows) a second."""
        prev = self._last.get(load.worker_id)
        self._last[load.worker_id] = load
        if prev is None or load.timestamp <= prev.timestamp:
            return 0.0, 0.0
        wall = load.timestamp - prev.timestamp
        stepped = load.steps.busy_s() - prev.steps.busy_s()
        tokens = (load.steps.prefill_tokens + load.steps.decode_rows) - (
            prev.steps.prefill_tokens + prev.steps.decode_rows
        )
        return max(0.0, min(1.0, stepped / wall)), max(0.0, tokens / wall)

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
        ttfts = {  # a prefill pool answers for the prompts it computed; decode for none
            WorkerRole.PREFILL: [r.prefill_ttft_p90_s for r in self.doors.values()],
            WorkerRole.DECODE: [],
        }
        every_ttft = [r.ttft_p90_s for r in self.doors.values()]
        itls = [r.itl_p90_s for r in self.doors.values() if r.itl_p90_s is not None]
        out = {}
        for pool in sizes:
            mine = [load for role, load in loads if role == pool]
            rates = [self.rates(load) for load in mine]
            batch = sum(load.batch_usage for load in mine) / len(mine) if mine else 0.0
            trend = self._batch.setdefault(pool, collections.deque(maxlen=TREND_LOOKS))
            trend.append((now, batch))
            at_doors = [r.waiting.get(pool, (0, 0.0)) for r in self.doors.values()]
            pool_ttfts = [t for t in ttfts.get(pool, every_ttft) if t is not None]
            out[pool] = PoolSignals(
                ready=len(mine),
                starting=starting.get(pool, 0),
                queued=sum(load.num_waiting for load in mine) + sum(n for n, _ in at_doors),
                oldest_wait_s=max(
                    [load.oldest_wait_s for load in mine] + [w for _, w in at_doors] + [0.0]
                ),
                ttft_p90_s=max(pool_ttfts) if pool_ttfts else None,
                itl_p90_s=max(itls) if itls and pool != WorkerRole.PREFILL else None,
                kv_usage=sum(load.kv_usage for load in mine) / len(mine) if mine else 0.0,
                batch_usage=batch,
                batch_growth_per_s=slope(trend),
                busy=sum(b for b, _ in rates) / len(rates) if rates else 0.0,
                tokens_per_s=sum(t for _, t in rates),
            )
        return out
