"""Pickers: the one worker a decision takes from the candidates.

round_robin   the next candidate in turn (the pool's order), ignoring any totals
random        a uniform choice, from a generator seeded with `seed` (reproducible runs)
max_score     the highest total score (ties: the first in the pool's order)
least_cost    the smallest total cost; ties: the smaller `tie` value (`prefill_load`: L_w
              as the pool files it; `running`: requests in the batch), then the first
              from a rotating start in the pool's order (`start`: `lightest`, the
              position of the lightest worker this turn, or `turn`, the decision count
              modulo the pool size), so equal workers share the load. Reports the
              winner's cost and, with `runner_up`, the cheapest other candidate's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from router.routing.policies.plugin import Candidates, Picker, plugin


@plugin("round_robin")
class RoundRobin(Picker):
    def __init__(self) -> None:
        self._next = 0

    def pick(self, cands: Candidates, totals: Sequence[float]) -> int:
        k = self._next % len(cands.positions)
        self._next += 1
        return k


@plugin("random")
class Random(Picker):
    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def pick(self, cands: Candidates, totals: Sequence[float]) -> int:
        return self._rng.choice(range(len(cands.positions)))


@plugin("max_score")
class MaxScore(Picker):
    wants_costs = False

    def pick(self, cands: Candidates, totals: Sequence[float]) -> int:
        positions = cands.positions
        return min(range(len(positions)), key=lambda k: (-totals[k], positions[k]))


_TIES: dict[str, Callable[[Candidates, int], int]] = {
    "prefill_load": lambda cands, i: cands.pool.loads[i],
    "running": lambda cands, i: cands.ctx.workers[i].running,
}
_STARTS: dict[str, Callable[[Candidates], int]] = {
    "lightest": Candidates.lightest,
    "turn": lambda cands: cands.turn % len(cands.ctx.workers),
}


@plugin("least_cost")
class LeastCost(Picker):
    wants_costs = True

    def __init__(self, tie: str, start: str, runner_up: bool = False) -> None:
        if tie not in _TIES or start not in _STARTS:
            raise ValueError(f"least_cost: tie in {sorted(_TIES)}, start in {sorted(_STARTS)}")
        self._tie = _TIES[tie]
        self._start = _STARTS[start]
        self.runner_up = runner_up
        self.term_names = ("cost", "runner_up_cost") if runner_up else ("cost",)

    def pick(self, cands: Candidates, totals: Sequence[float]) -> int:
        n, start, tie, positions = (
            len(cands.ctx.workers),
            self._start(cands),
            self._tie,
            cands.positions,
        )
        return min(
            range(len(positions)),
            key=lambda k: (totals[k], tie(cands, positions[k]), (positions[k] - start) % n),
        )

    def terms(self, cands: Candidates, totals: Sequence[float], k: int) -> tuple[float, ...]:
        if not self.runner_up:
            return (totals[k],)
        others = [total for j, total in enumerate(totals) if j != k]
        return (totals[k], min(others, default=float("inf")))
