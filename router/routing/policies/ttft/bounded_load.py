"""Bounded load (consistent hashing with bounded loads), the ttft policy's filter.

    P_w    the decayed prefill time the policy placed on w (tally.py); n workers
    bound  = (1 + balance_slack) * mean P

    1. Only workers with  P_w <= bound  are candidates, so no prefix, however popular, pins
       the pool to one worker, even while no queue has formed yet to push back (a light
       trickle then a burst, or a first block every prompt shares). The lightest P_w is
       never over the mean: a candidate always remains.
    2. With `balance_room` (the default) the request's own work counts too, as in consistent
       hashing with bounded loads: a candidate it would take over the bound,
           P_w + work_w > max((1 + balance_slack) * (sum P + work_w) / n, work_w)
       (a worker with nothing placed always has room for one), is NO_ROOM: it comes after
       every candidate the request fits, and among such workers the least loaded after it
       wins, not the cheapest (picker.py), so a long prompt no worker has room for goes
       where it overshoots least. Checked before the placement only, a long prompt's whole
       work could land on a worker just under the bound.
    3. With `balance_measured` a candidate must also be within the same bound on the work it
       was measured to do: M_w + t_w * L_w (tally.py: the engine seconds its reports add
       between decisions, decayed alike, plus what it has queued) against (1 + slack) times
       their mean; over it, it is OVER_MEASURED: after those within both. P_w counts
       estimates made at routing time; what a worker then computes differs (a hit evicted
       while it queued, a pull's copy, attention the estimate misses), and the load the
       workers end with is theirs, not the estimates'. M_w alone lags (a report comes after
       the work), so both bounds hold; where no worker is within both, the ones within P_w's
       are the candidates.

Tiers, in the order the picker takes them: FITS, OVER_MEASURED, NO_ROOM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.routing.policies.ttft.tally import Tally
from router.routing.worker_state import WorkerState

FITS, OVER_MEASURED, NO_ROOM = 0, 1, 2


@dataclass(frozen=True, slots=True)
class LoadBound:
    """One decision's bound, from the tallies before it."""

    tallies: list[float]
    """P_w, in pool order."""
    total: float
    """sum P."""
    room: float
    """1 + balance_slack."""
    bound: float
    over_measured: list[int]
    """1 where M_w + t_w * L_w is over its bound (all 0 without `balance_measured`)."""
    check_room: bool

    def candidates(self) -> list[int]:
        """Positions within the bound before this request (step 1)."""
        bound = self.bound
        return [j for j, tally in enumerate(self.tallies) if not tally > bound]

    def tier(self, j: int, work: float) -> int:
        """FITS, OVER_MEASURED or NO_ROOM for a candidate taking `work` seconds (steps 2, 3)."""
        tally, n = self.tallies[j], len(self.tallies)
        if self.check_room and tally + work > max(self.room * (self.total + work) / n, work):
            return NO_ROOM
        return self.over_measured[j]

    def over_mean(self, j: int) -> float:
        """P_w / mean P (1 while nothing is placed)."""
        mean = self.total / len(self.tallies)
        return self.tallies[j] / mean if mean > 0 else 1.0


class BoundedLoad:
    """Reads the tallies for each decision (and feeds M_w its new engine seconds)."""

    def __init__(
        self, tally: Tally, balance_slack: float, room: bool, measured: bool, s_per_token: float
    ) -> None:
        self.tally = tally
        self.balance_slack = balance_slack
        self.balance_room = room
        self.balance_measured = measured
        self.s_per_token = s_per_token

    def bound(self, workers: Sequence[WorkerState]) -> LoadBound:
        n = len(workers)
        tallies = self.tally.placed_on(workers)
        total = sum(tallies)
        room = 1.0 + self.balance_slack
        bound = room * total / n
        over = self._over_measured(workers) if self.balance_measured else [0] * n
        return LoadBound(tallies, total, room, bound, over, self.balance_room)

    def _over_measured(self, workers: Sequence[WorkerState]) -> list[int]:
        loads = self.tally.measure(workers, self.s_per_token)
        if loads is None:  # nothing measured yet: nothing to balance
            return [0] * len(workers)
        bound = (1.0 + self.balance_slack) * sum(loads) / len(loads)
        return [1 if load > bound else 0 for load in loads]
