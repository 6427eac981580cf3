"""Baselines for both pools: round robin, least loaded, uniformly random.

They ignore the prefix index; benchmarks compare the cache-aware policies against them.
"""

from __future__ import annotations

import random

from router.routing.policies.base import Choice, Policy, RouteContext, pool_load, register


@register("round_robin")
class RoundRobin(Policy):
    """Workers in turn, in pool order."""

    name = "round_robin"

    def __init__(self, pool: str) -> None:
        super().__init__(pool)
        self._next = 0

    def choose(self, ctx: RouteContext) -> Choice:
        worker = ctx.workers[self._next % len(ctx.workers)]
        self._next += 1
        return Choice(worker, "round_robin")


_LOAD = ("load",)


@register("least_loaded")
class LeastLoaded(Policy):
    """Smallest load: queued prefill tokens (prefill pool), running requests (decode pool)."""

    name = "least_loaded"

    def choose(self, ctx: RouteContext) -> Choice:
        pool = self.pool
        worker = min(ctx.workers, key=lambda w: pool_load(w, pool))
        return Choice(worker, "least_loaded", _LOAD, (float(pool_load(worker, pool)[0]),))


@register("random")
class Random(Policy):
    """Uniform choice; seeded so runs are reproducible."""

    name = "random"

    def __init__(self, pool: str, seed: int = 0) -> None:
        super().__init__(pool)
        self._rng = random.Random(seed)

    def choose(self, ctx: RouteContext) -> Choice:
        return Choice(self._rng.choice(ctx.workers), "random")
