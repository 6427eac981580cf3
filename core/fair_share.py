"""Who goes next when several tenants wait: priority first, then a token-weighted fair share.

A queue (an engine's waiting requests, a prefill worker's gate at the front door) serves its
requests in classes: the best `priority` present first (vLLM's semantics: lower runs first),
and within it the tenant that has been served least. "Served" is a virtual token counter
per tenant (VTC: Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024):
prompt tokens times `prompt_token_weight` plus output tokens times `output_token_weight`,
divided by the tenant's weight. A tenant whose queue was empty and fills again has its
counter lifted to the least of those waiting, so time spent idle banks no credit to spend
as a burst later. Within one class, requests keep the queue's own order.

Both queues share this file and nothing else: the gate charges the prompt tokens it admits
and the output tokens the door streams; an engine charges what each step computes. With
fair share off the tenant plays no part (one class per priority); with every priority equal
as well, the queue is first in, first out as before.

Torch-free: the front door and the engines use it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class FairShareConfig:
    enabled: bool = True
    weights: tuple[tuple[str, float], ...] = ()
    """(tenant, weight) pairs (1.0 for a tenant not named): a tenant of weight 2 is served
    twice the tokens of one of weight 1 when both wait. Pairs, so the config hashes."""
    prompt_token_weight: float = 1.0
    output_token_weight: float = 2.0
    """An output token costs a decode step's share of a batch; VTC's paper weighs it 2:1."""

    def __post_init__(self) -> None:
        for name, w in self.weights:
            if not w > 0:
                raise ValueError(f"tenant weight of {name!r} must be > 0, got {w}")
        if self.prompt_token_weight < 0 or self.output_token_weight < 0:
            raise ValueError("prompt_token_weight and output_token_weight must be >= 0")

    @functools.cached_property
    def _weight_of(self) -> dict[str, float]:
        return dict(self.weights)

    def weight(self, tenant: str) -> float:
        """Read on every charge (each engine step): the pairs as a dict, built once."""
        return self._weight_of.get(tenant, 1.0)


def parse_weights(text: str) -> tuple[tuple[str, float], ...]:
    """`NAME=W,NAME=W` -> ((name, weight), ...); a malformed entry is a ValueError naming it."""
    weights: dict[str, float] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, value = entry.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = float("nan")
        if not sep or not name or not weight > 0:
            raise ValueError(f"tenant weight {entry!r}: expected NAME=W with W > 0")
        weights[name.strip()] = weight
    return tuple(weights.items())


class FairShare:
    """The tenants' virtual counters, and the class a request queues in."""

    def __init__(self, config: FairShareConfig | None = None) -> None:
        self.config = config or FairShareConfig()
        self._served: dict[str, float] = {}

    def served(self, tenant: str) -> float:
        return self._served.get(tenant, 0.0)

    def charge(self, tenant: str, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        c = self.config
        cost = prompt_tokens * c.prompt_token_weight + output_tokens * c.output_token_weight
        if cost:
            self._served[tenant] = self.served(tenant) + cost / c.weight(tenant)

    def rejoin(self, tenant: str, waiting: Iterable[str]) -> None:
        """`tenant` queues again after its queue was empty: its counter rises to the least
        counter of the tenants in `waiting` (those with requests queued now), if higher."""
        if not self.config.enabled:
            return
        floor = min((self.served(t) for t in waiting if t != tenant), default=None)
        if floor is not None and floor > self.served(tenant):
            self._served[tenant] = floor

    def class_of(self, priority: int, tenant: str) -> tuple[int, str]:
        """The class a request queues in: (priority, tenant), or (priority, "") when fair
        share is off."""
        return (priority, tenant if self.config.enabled else "")

    def next_class(self, classes: Iterable[tuple[int, str]]) -> tuple[int, str] | None:
        """Of the classes with requests waiting, the one served next: the best priority,
        then the tenant served least (by name on ties, so the choice is stable)."""
        return min(classes, key=lambda c: (c[0], self.served(c[1]), c[1]), default=None)
