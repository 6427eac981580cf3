"""What one worker of a pool can carry, as the pool has shown it: the autoscaler's check that
a scale-down leaves enough workers for the load (pure; no Ray).

A pool's served work is measured in tokens through the model per second (prompt tokens
computed plus decode rows: each is one token's pass through every layer). A worker's
*capacity* is the most work per worker the pool did while it was over its target (pressure
> 1: requests queued, latency past its SLO, or a batch about to fill) with every worker it
wanted ready: about as much as a worker can do. The largest of the last `SAMPLES` such looks
stands for it. A look that fired early (the batch term looks a start-up ahead, before the
worker is full) reads less than a worker can do, which only makes scale-down more careful.

Scale-down check, one worker fewer:

    projected = peak_tokens_per_s / ((size - 1) * capacity)      must be <= headroom

`peak_tokens_per_s` is the pool's most work in the last `window` calm looks (the calm
periods that ask for the scale-down; not the whole spell, which may have begun in the burst
a calm low phase follows). Why: latency and queue wait are what the pool shows at its
current size, and a pool of two that carries 1.3 workers' worth of work reads calm (short
queues, ITL far under target) while one worker alone would queue without bound; without
this check the autoscaler drains a worker mid-burst and starts it again seconds later.
Before the pool has ever been over its target no capacity is known and the check passes
(the pressure rule alone decides), and a pool going to zero workers (the prefill pool:
decode workers take its prompts) is not projected.
"""

from __future__ import annotations

import collections

SAMPLES = 30


class CapacityBook:
    def __init__(self, headroom: float, window: int) -> None:
        self.headroom = headroom
        self.window = window
        self._seen: dict[str, collections.deque[float]] = {}
        self._calm: dict[str, collections.deque[float]] = {}

    def observe(self, pool: str, tokens_per_s: float, ready: int, saturated: bool) -> None:
        """One look at a pool: its work, its ready workers, and whether it was over target
        with every worker it wanted ready (the caller's judgement)."""
        if saturated and ready > 0 and tokens_per_s > 0:
            self._seen.setdefault(pool, collections.deque(maxlen=SAMPLES))
            self._seen[pool].append(tokens_per_s / ready)

    def capacity(self, pool: str) -> float | None:
        """Tokens per second one worker of the pool carried at most while saturated."""
        seen = self._seen.get(pool)
        return max(seen) if seen else None

    def calm_look(self, pool: str, tokens_per_s: float) -> None:
        """A calm look: its work joins the last `window` looks'."""
        self._calm.setdefault(pool, collections.deque(maxlen=self.window))
        self._calm[pool].append(tokens_per_s)

    def calm_ended(self, pool: str) -> None:
        self._calm.pop(pool, None)

    def projected(self, pool: str, size: int) -> float | None:
        """The last calm looks' peak work over what `size - 1` workers carry at capacity;
        None when it cannot be said (no capacity seen yet, or one worker fewer is none)."""
        cap = self.capacity(pool)
        if cap is None or size <= 1:
            return None
        peak = max(self._calm.get(pool, ()), default=0.0)
        return peak / ((size - 1) * cap)

    def can_shrink(self, pool: str, size: int) -> bool:
        p = self.projected(pool, size)
        return p is None or p <= self.headroom
