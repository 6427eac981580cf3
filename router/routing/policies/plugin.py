"""The pieces a routing policy is configured from, in the shape of llm-d's scheduler:

    candidates = the pool's workers (positions in `ctx.workers`)
    for each filter:  candidates = filter(candidates)     or the filter settles the choice
    total_w = sum over scorers of  weight * score_w        each score in [0, 1], higher better
    worker  = picker(candidates, totals)

A Filter drops the workers that must not, or need not, be scored (a worker that cannot win
costs nothing to leave out); it may also settle the choice itself, as a guard that sees the
pool out of balance does. A Scorer rates every candidate; a Picker chooses one from the
weighted totals, breaking ties its own way. Each piece is small, pure apart from its own
counters (a rotation, a seeded generator), and registered by name, so a policy is a
configuration of them (policies/configurations.py), not a branch in a long `choose`.

A Cost is the Scorer for formulas in one unit (prompt tokens, seconds, shares of the decode
pool's room), where lower is better and a least-cost picker chooses. llm-d's [0, 1] scores
suit terms of different kinds that only a weight relates; the cache-aware formulas add terms
in one unit, with weights the CLI and the benchmarks set and ties broken on the load:
rescaling each term to [0, 1] would change which worker wins, and the terms printed in the
debug log would no longer add up to the cost.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from router.routing.policies.base import Choice, RouteContext
from router.routing.pool import Pool


class Candidates:
    """One decision's working set, handed from stage to stage: the context, the positions
    (in `ctx.workers`) still in the running, and the policy's decision count (rotations)."""

    __slots__ = ("_lightest", "_pool", "ctx", "positions", "turn")

    def __init__(self, ctx: RouteContext, turn: int) -> None:
        self.ctx = ctx
        self.turn = turn
        """Decisions the policy has made, this one included."""
        self.positions: Sequence[int] = range(len(ctx.workers))
        self._pool: Pool | None = None
        self._lightest = -1

    @property
    def pool(self) -> Pool:
        """The pool with its prefill-load order (built once, if the caller keeps none)."""
        if self._pool is None:
            self._pool = self.ctx.pool_view()
        return self._pool

    def lightest(self) -> int:
        """Position of the lightest worker this turn (equal ones take turns; pool.py)."""
        if self._lightest < 0:
            self._lightest = self.pool.lightest(self.turn)
        return self._lightest


class Filter(abc.ABC):
    """Narrows the candidates. Never leaves none: where none would remain, it settles the
    choice (or keeps them all)."""

    name: ClassVar[str] = ""

    @abc.abstractmethod
    def filter(self, cands: Candidates) -> Sequence[int] | Choice:
        """The positions still in the running, or the choice when this filter settles it."""


class Scorer(abc.ABC):
    """Rates each candidate: a value in [0, 1], higher is better."""

    name: ClassVar[str] = ""
    higher_is_better: ClassVar[bool] = True
    term_names: ClassVar[tuple[str, ...]] = ()
    """What `terms` reports of the winner, for the decision and the debug log."""

    @abc.abstractmethod
    def score(self, cands: Candidates) -> list[float]:
        """One value per position in `cands.positions`, in that order."""

    def terms(self, cands: Candidates, i: int) -> tuple[float, ...]:
        """This scorer's inputs for the worker at position i (the winner)."""
        return ()


class Cost(Scorer):
    """Prices each candidate in the policy's unit: a value >= 0, lower is better."""

    higher_is_better = False


class Picker(abc.ABC):
    """Chooses one candidate from the weighted totals (which it may ignore)."""

    name: ClassVar[str] = ""
    wants_costs: ClassVar[bool | None] = None
    """True: the totals are costs; False: scores; None: it reads no totals."""
    term_names: tuple[str, ...] = ()

    @abc.abstractmethod
    def pick(self, cands: Candidates, totals: Sequence[float]) -> int:
        """The index in `cands.positions` (and `totals`) of the chosen worker."""

    def terms(self, cands: Candidates, totals: Sequence[float], k: int) -> tuple[float, ...]:
        """The picker's terms for the winner (index k), e.g. its total."""
        return ()


P = TypeVar("P", Filter, Scorer, Picker)
_KIND_WORDS: dict[type, str] = {Filter: "filter", Cost: "cost", Scorer: "scorer", Picker: "picker"}
_PLUGINS: dict[str, type] = {}


def kind_of(cls: type) -> str:
    """The kind of plugin `cls` is: filter, cost, scorer or picker (a Cost is a Scorer too)."""
    return next(word for base, word in _KIND_WORDS.items() if issubclass(cls, base))


def plugin(name: str) -> Callable[[type[P]], type[P]]:
    """Class decorator: register a filter, scorer, cost or picker under `name`."""

    def deco(cls: type[P]) -> type[P]:
        if name in _PLUGINS:
            raise ValueError(f"routing plugin {name!r} registered twice")
        cls.name = name
        _PLUGINS[name] = cls
        return cls

    return deco


def make_plugin(kind: type[P], name: str, args: dict[str, Any]) -> P:
    """The plugin registered as `name`, which must be of `kind`, built with `args`."""
    cls = _PLUGINS.get(name)
    if cls is None or not issubclass(cls, kind):
        word = kind_of(kind)
        names = sorted(n for n, c in _PLUGINS.items() if issubclass(c, kind))
        raise ValueError(f"unknown {word} {name!r}; choose from {names}")
    return cls(**args)
