"""The autoscaler's decision: each pool's size from its signals and the SLOs (pure; no Ray).

Per pool, one number says how far it is from its SLO budget, its *pressure* (1.0: at the
limit), the largest of:

    prefill (TTFT)   oldest_wait / (queue_share * ttft_slo)   queue wait, seen before TTFT
                     ttft_p90 / ttft_slo                      what clients saw lately, of
                                                              the prompts the pool computed
                     busy / busy_target                       stepping share of wall time
    decode (ITL)     itl_p90 / itl_slo
                     kv_usage / kv_target                     room for the next reservations
                     (batch_usage + growth * lead_s)          running-request slots in use
                       / batch_target                         a start-up from now
                     oldest_wait / (queue_share * ttft_slo)   prompts it prefills itself, and
                                                              transfers waiting for blocks

The batch term leads the queue term on a worker that prefills its own prompts: it admits
every prompt up to its cap on running requests, so nothing queues until the batch is full,
and near its capacity the batch fills fast (each request stays longer as steps slow, so more
run at once: Little's law); at the cap the queue, and TTFT, grow without bound (measured in
the bursty benchmark: one worker kept up for ~25 s of a burst, then its batch filled and
TTFT passed 4 s within 5 s). So the term looks ahead: the slots in use `lead_s` from now
(the time a new worker takes to serve) at the rate they have been filling (`growth`, the
slope of batch usage over the last evaluations, signals.py; a shrinking batch is not projected),
and a pool whose batch will be full before a worker started now could help grows now.

Busy is no decode signal: a decode worker steps without pause while it has any request,
so two light streams read ~0.9 busy with ITL a tenth of its target (measured in the bursty
benchmark, where that term grew the decode pool in the quiet phase). Its capacity shows as
ITL (a step slows as its batch grows) and KV usage.

The queue term is why the planner reacts before latency shows it: a request waiting in a
queue has not finished, so no TTFT sample exists yet, but its wait is known the moment it
grows. `queue_share` is the part of the TTFT budget a queue may take (the rest is the
prefill itself).

Scale up: pressure > 1 -> size * pressure (rounded up, at least one more), at most `max`,
at most one step per `up_cooldown_s`. Workers still starting count toward the size, so a
slow start is not answered with more starts.
Scale down: pressure below `calm` for `calm_periods` evaluations in a row (none of them
while the pool has workers starting), `down_cooldown_s` since the pool last changed, and
one worker fewer able to carry the last calm looks' work (capacity.py: at most `down_headroom`
of the capacity per worker the pool showed while saturated) -> one worker fewer (the
controller drains it: no request is lost), never under `min`. The gap between `calm` and
1.0 is the hysteresis; the capacity check is what keeps a pool that is calm *because* it
is large from shrinking in the middle of a burst.

Scale to zero: the prefill pool may shrink to 0 (decode workers then prefill themselves);
it comes back when the decode pool's queue pressure (prompts waiting there) passes 1, which
is the TTFT term the empty prefill pool would have had.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from core.roles import WorkerRole
from router.cluster.autoscale.capacity import CapacityBook


@dataclass(frozen=True)
class AutoscaleConfig:
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.2
    min_sizes: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 1})
    max_sizes: dict[str, int] = field(default_factory=lambda: {"prefill": 8, "decode": 8})
    interval_s: float = 2.0
    up_cooldown_s: float = 10.0
    down_cooldown_s: float = 60.0
    calm: float = 0.5
    calm_periods: int = 5
    queue_share: float = 0.5
    busy_target: float = 0.9
    kv_target: float = 0.85
    batch_target: float = 0.85
    lead_s: float = 10.0
    """How long a new worker takes to serve (start, load, join): the lead term's horizon."""
    down_headroom: float = 0.75

    def __post_init__(self) -> None:
        if self.ttft_slo_s <= 0 or self.itl_slo_s <= 0:
            raise ValueError("the TTFT and ITL targets must be > 0 seconds")
        if not 0 < self.calm < 1:
            raise ValueError(f"calm must be in (0, 1), got {self.calm}")
        if self.lead_s < 0:
            raise ValueError(f"lead_s must be >= 0, got {self.lead_s}")
        if not 0 < self.down_headroom <= 1:
            raise ValueError(f"down_headroom must be in (0, 1], got {self.down_headroom}")
        for pool, low in self.min_sizes.items():
            high = self.max_sizes.get(pool, low)
            if not 0 <= low <= high:
                raise ValueError(f"pool {pool}: need 0 <= min ({low}) <= max ({high})")
        if self.min_sizes.get(WorkerRole.DECODE, 1) < 1:
            raise ValueError("the decode pool needs at least one worker")


@dataclass(frozen=True)
class PoolSignals:
    """One pool, over the last evaluation period (collected by signals.py)."""

    ready: int
    starting: int = 0
    queued: int = 0
    oldest_wait_s: float = 0.0
    """The longest any queued request of this pool has waited (engine queues and the front
    doors' prefill gates)."""
    ttft_p90_s: float | None = None
    itl_p90_s: float | None = None
    """From the front doors' recent window; None when no request finished there lately."""
    kv_usage: float = 0.0
    batch_usage: float = 0.0
    """Mean share of the workers' running-request slots in use, 0..1."""
    batch_growth_per_s: float = 0.0
    """How fast that share has grown over the last evaluations (negative: emptying)."""
    busy: float = 0.0
    """Mean share of wall time the pool's workers spent stepping, 0..1."""
    tokens_per_s: float = 0.0
    """The pool's work: prompt tokens computed plus decode rows per second, all its ready
    workers together (capacity.py)."""


@dataclass(frozen=True)
class Decision:
    pool: str
    size: int
    target: int
    pressure: float
    reason: str
    signals: dict
    at: float
    terms: dict[str, float] = field(default_factory=dict)
    """Every pressure term the pool's pressure is the largest of, by name."""
    min_size: int = 0
    max_size: int = 0
    capacity_per_worker: float | None = None
    """Tokens per second one worker carried at most while saturated (capacity.py; None:
    not seen yet): what the scale-down check divides by."""

    def line(self) -> str:
        """The log line: the decision and every input it was made from."""
        inputs = " ".join(f"{k}={_fmt(v)}" for k, v in self.signals.items())
        return (
            f"autoscale {self.pool}: {self.size} -> {self.target} ({self.reason}; "
            f"pressure {self.pressure:.2f}; {inputs})"
        )


def _fmt(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def queue_pressure(oldest_wait_s: float, c: AutoscaleConfig) -> float:
    """A queue's wait against the share of the TTFT budget a queue may take."""
    return oldest_wait_s / (c.queue_share * c.ttft_slo_s)


def pressure(pool: str, s: PoolSignals, c: AutoscaleConfig) -> tuple[float, str]:
    """The pool's pressure and the term that set it."""
    terms = pressure_terms(pool, s, c)
    name = max(terms, key=lambda k: terms[k])
    return terms[name], name


def pressure_terms(pool: str, s: PoolSignals, c: AutoscaleConfig) -> dict[str, float]:
    """Each term of the pool's pressure (the table above), by name."""
    terms = {"queue wait": queue_pressure(s.oldest_wait_s, c)}
    if pool == WorkerRole.PREFILL:
        terms["busy"] = s.busy / c.busy_target
    else:  # decode, or unified (both phases)
        terms["kv usage"] = s.kv_usage / c.kv_target
        ahead = s.batch_usage + max(0.0, s.batch_growth_per_s) * c.lead_s
        terms["batch slots"] = ahead / c.batch_target
        if s.itl_p90_s is not None:
            terms["ITL p90"] = s.itl_p90_s / c.itl_slo_s
    if pool != WorkerRole.DECODE and s.ttft_p90_s is not None:
        terms["TTFT p90"] = s.ttft_p90_s / c.ttft_slo_s
    return terms


class Autoscaler:
    """Remembers what hysteresis and cool-downs need between evaluations."""

    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self._changed_at: dict[str, float] = {}
        self._calm_runs: dict[str, int] = {}
        self.capacity = CapacityBook(config.down_headroom, config.calm_periods)

    def decide(
        self, signals: dict[str, PoolSignals], sizes: dict[str, int], now: float
    ) -> list[Decision]:
        """One decision per pool in `sizes` (the desired sizes now); `target` == `size`
        when nothing changes. `now`: seconds (time.time() or any clock that does not
        jump)."""
        c = self.config
        decisions = []
        for pool, size in sizes.items():
            s = signals.get(pool, PoolSignals(ready=0))
            terms = pressure_terms(pool, s, c)
            p, term = pressure(pool, s, c)
            if pool == WorkerRole.PREFILL and size == 0:
                # Decode workers prefill themselves: their queue is the TTFT signal.
                d = signals.get(WorkerRole.DECODE, PoolSignals(ready=0))
                p, term = queue_pressure(d.oldest_wait_s, c), "decode queue wait"
                terms = {term: p}
            saturated = p > 1.0 and s.starting == 0 and s.ready >= size
            self.capacity.observe(pool, s.tokens_per_s, s.ready, saturated)
            target, reason = self._target(pool, size, p, term, now, s)
            if target != size:
                self._changed_at[pool] = now
                self._end_calm(pool)
            low, high = self._bounds(pool, size)
            decisions.append(
                Decision(
                    pool, size, target, p, reason, asdict(s), now,
                    terms, low, high, self.capacity.capacity(pool),
                )
            )  # fmt: skip
        return decisions

    def _bounds(self, pool: str, size: int) -> tuple[int, int]:
        """(min, max) workers of the pool; a unified pool (both phases) takes the decode
        pool's."""
        c = self.config
        low = c.min_sizes.get(pool, c.min_sizes.get(WorkerRole.DECODE, 1))
        high = c.max_sizes.get(pool, c.max_sizes.get(WorkerRole.DECODE, size))
        return low, high

    def _end_calm(self, pool: str) -> None:
        self._calm_runs[pool] = 0
        self.capacity.calm_ended(pool)

    def _target(
        self, pool: str, size: int, p: float, term: str, now: float, s: PoolSignals
    ) -> tuple[int, str]:
        c = self.config
        low, high = self._bounds(pool, size)
        since = now - self._changed_at.get(pool, -math.inf)
        if size < low:
            return low, f"below its minimum {low}"
        if size > high:
            return high, f"above its maximum {high}"
        if p > 1.0:
            self._end_calm(pool)
            if size >= high:
                return size, f"{term} over target, at its maximum {high}"
            if since < c.up_cooldown_s:
                return size, f"{term} over target, cooling down ({since:.0f} s)"
            want = max(size + 1, math.ceil(size * p))
            return min(high, want), f"{term} over target"
        if s.starting > 0:  # calm while workers load says nothing about the pool's load
            self._end_calm(pool)
            return size, "workers starting"
        if p < c.calm:
            self._calm_runs[pool] = runs = self._calm_runs.get(pool, 0) + 1
            self.capacity.calm_look(pool, s.tokens_per_s)
            if size <= low:
                return size, "calm, at its minimum"
            if runs < c.calm_periods:
                return size, f"calm {runs}/{c.calm_periods}"
            if since < c.down_cooldown_s:
                return size, f"calm, cooling down ({since:.0f} s)"
            if not self.capacity.can_shrink(pool, size):
                projected = self.capacity.projected(pool, size)
                return size, f"calm, but {size - 1} would carry {projected:.2f} of capacity"
            return size - 1, f"calm for {runs} periods"
        self._end_calm(pool)
        return size, "within target"
