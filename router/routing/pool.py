"""A pool of workers as the policies see it, with its prefill-load order kept sorted.

The prefill policy and the overflow check (overflow.py) need, per decision, the lightest
and heaviest prefill load of the pool (L_w = queued prefill tokens, router.routing.load) and
the lightest workers in pool order (they take turns). Scanning the pool for that is
O(pool) per decision; instead the pool keeps its loads sorted and the LoadTracker re-files a
worker whenever its load changes (a report, a routed request, a finished prefill):

    workers   [w0, w1, w2, w3]           fixed order (membership changes build a new Pool)
    loads     [ 40,  0, 90,  0]          L_w as last filed
    by_load   [(0,1), (0,3), (40,0), (90,2)]   sorted (L, position): min, max and the
                                         lightest run [(0,1), (0,3)] in pool order

So min / max / "k-th lightest" are O(1) (+ one bisect) and a load change is O(log n) compares
plus a C memmove. A Pool built from a plain list (policy tests, ad-hoc callers) files the
loads it sees at construction; only a LoadTracker-owned pool follows later changes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Container, Iterator, Sequence

from router.routing.worker_state import WorkerState, prefill_load


class Pool:
    """Workers that can serve one role of one model, in a fixed order. Not thread-safe."""

    __slots__ = ("_by_load", "loads", "position", "workers")

    def __init__(self, workers: Sequence[WorkerState]) -> None:
        self.workers: list[WorkerState] = list(workers)
        self.position: dict[str, int] = {w.worker_id: i for i, w in enumerate(self.workers)}
        # L of each position as last filed; read-only outside this class
        self.loads = [prefill_load(w) for w in self.workers]
        self._by_load = sorted((load, i) for i, load in enumerate(self.loads))

    def __len__(self) -> int:
        return len(self.workers)

    def __iter__(self) -> Iterator[WorkerState]:
        return iter(self.workers)

    def __getitem__(self, i: int) -> WorkerState:
        return self.workers[i]

    @property
    def min_load(self) -> int:
        """Smallest L in the pool (like max_load and lightest: the pool must be non-empty)."""
        return self._by_load[0][0]

    @property
    def max_load(self) -> int:
        return self._by_load[-1][0]

    def lightest(self, turn: int) -> int:
        """Position of the (turn mod k)-th of the k workers at the minimum load, in pool order,
        so equal workers take turns."""
        by_load = self._by_load
        k = bisect_right(by_load, (by_load[0][0], len(by_load)))
        return by_load[turn % k][1]

    def lightest_without(self, exclude: Container[str]) -> int | None:
        """Position of the lightest worker whose id is not in `exclude` (O(excluded))."""
        for _, i in self._by_load:
            if self.workers[i].worker_id not in exclude:
                return i
        return None

    def refile(self, i: int) -> None:
        """The load of the worker at position i may have changed: re-file it."""
        new = prefill_load(self.workers[i])
        old = self.loads[i]
        if new != old:
            by_load = self._by_load
            del by_load[bisect_left(by_load, (old, i))]
            insort(by_load, (new, i))
            self.loads[i] = new

    def check(self) -> None:
        """Invariant (tests): the filed order is the sorted current loads."""
        loads = [prefill_load(w) for w in self.workers]
        if loads != self.loads or self._by_load != sorted(zip(loads, range(len(loads)))):
            raise AssertionError(f"pool loads filed {self.loads}, actual {loads}")
