"""A policy as configuration: filters, weighted scorers and a picker, run in that order.

    choose(ctx):
        candidates = every worker of the pool
        for each filter: narrow the candidates (a filter may settle the choice: return it)
        total[k] = sum of weight * value over the scorers, in their order
        k = picker(candidates, total)
        the Choice: the worker, the reason (the configuration's name, `_no_hit` added where
        the configuration says so and the winner caches none of the prompt), and the terms:
        the picker's, then each scorer's, for the winner

A `Configuration` names its pieces (policies/plugin.py's registry) with their arguments, so
it can be printed, compared and checked before a router uses it; `build` makes the Policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.routing.policies.base import Choice, Policy, RouteContext
from router.routing.policies.plugin import (
    Candidates,
    Filter,
    Picker,
    Scorer,
    make_plugin,
)


@dataclass(frozen=True)
class Use:
    """One plugin by its registered name, with its arguments."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.args.items())
        return f"{self.name}({args})" if args else self.name


@dataclass(frozen=True)
class Configuration:
    """A routing policy as data."""

    name: str
    picker: Use
    filters: tuple[Use, ...] = ()
    scorers: tuple[tuple[float, Use], ...] = ()
    """(weight, scorer): all scores ([0, 1], higher better) or all costs (lower better)."""
    formula: str = ""
    """The cost formula, printed in the Router's debug log line beside the terms."""
    no_hit_reason: bool = False
    """The reason says `<name>_no_hit` when the winner caches none of the prompt."""

    def build(self, pool: str) -> Pipeline:
        filters = [make_plugin(Filter, use.name, dict(use.args)) for use in self.filters]
        scorers = [(w, make_plugin(Scorer, use.name, dict(use.args))) for w, use in self.scorers]
        picker = make_plugin(Picker, self.picker.name, dict(self.picker.args))
        return Pipeline(pool, self, filters, scorers, picker)

    def __str__(self) -> str:
        stages = [str(use) for use in self.filters]
        if self.scorers:
            stages.append(" + ".join(f"{w:g}*{use}" for w, use in self.scorers))
        stages.append(str(self.picker))
        return f"{self.name}: " + " -> ".join(stages)


class Pipeline(Policy):
    """Runs a Configuration (see the module docstring). Mutates only its pieces' counters."""

    def __init__(
        self,
        pool: str,
        config: Configuration,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[float, Scorer]],
        picker: Picker,
    ) -> None:
        super().__init__(pool)
        if any(w < 0 for w, _ in scorers):
            raise ValueError(f"{config.name}: scorer weights must be >= 0")
        kinds = {s.higher_is_better for _, s in scorers}
        if len(kinds) > 1:
            raise ValueError(f"{config.name}: scores and costs do not add up; use one kind")
        if kinds and picker.wants_costs is None:
            raise ValueError(f"{config.name}: picker {picker.name!r} reads no scores")
        if kinds and picker.wants_costs == kinds.pop():
            wants = "costs" if picker.wants_costs else "scores"
            raise ValueError(f"{config.name}: picker {picker.name!r} wants {wants}")
        self.name = config.name
        self.config = config
        self.formula = config.formula
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker
        self.term_names = picker.term_names + tuple(n for _, s in scorers for n in s.term_names)
        self._turn = 0

    def choose(self, ctx: RouteContext) -> Choice:
        self._turn += 1
        cands = Candidates(ctx, self._turn)
        for f in self.filters:
            kept = f.filter(cands)
            if isinstance(kept, Choice):
                return kept
            cands.positions = kept
        totals = [0.0] * len(cands.positions)
        for weight, scorer in self.scorers:
            for k, value in enumerate(scorer.score(cands)):
                totals[k] += weight * value
        k = self.picker.pick(cands, totals)
        i = cands.positions[k]
        worker = ctx.workers[i]
        values = self.picker.terms(cands, totals, k)
        for _, scorer in self.scorers:
            values += scorer.terms(cands, i)
        reason = self.name
        if self.config.no_hit_reason and not ctx.cached_blocks.get(worker.worker_id, 0):
            reason += "_no_hit"
        return Choice(worker, reason, self.term_names, values)
