"""The ttft policy's cost: a worker's estimated time to first token, plus the reuse its
placement destroys, in seconds.

    T    prompt tokens             B    block size          c_w  cached prefix blocks on w
    U_w  = max(0, T - c_w * B)     the tokens w would compute
    L_w  queued prefill tokens (its report + routed here since, router.routing.load)
    t_w  seconds per prefill token, calibrated online from w's own step totals
         (router.routing.step_rate); the prior `s_per_token` until w has reported work
    a_w  seconds of attention per query-key pair, and l_w seconds per token besides it,
         where w's engine times its attention (CPU; step_rate); else a_w = 0, l_w = t_w
    C_w  = T - U_w                  the positions before the part w computes
    s    per-request overhead (`step_s`: a prefill takes one engine step at least)
    N_w  blocks w's cache holds (the index)    K_w  its KV capacity in blocks (its reports)
    E_w  = max(0, N_w + ceil(U_w / B) - K_w)   blocks w must evict to store the new ones
    h_w  w's recent prefix reuse (its reports: cache hits plus prefix pulled from peers):
         how often what it caches is reused
    A_w  seconds since w stored the oldest of the N_w blocks it holds (its KV events,
         router/routing/index/turnover.py): the age of its LRU tail; Ā their mean over the
         workers where it is known (elsewhere A_w = Ā)
    ρ    the pool's recent utilization: the mean of its workers' (their reports), capped
         at `max_utilization`
    R_w  seconds w takes to copy back the part of its prefix only an offload tier holds
         (ctx.restore_s, router.routing.restore_cost): such a hit saves t_w*B per block
         less its copy, not t_w*B

    work_w     = s + l_w * U_w + a_w * U_w * (C_w + U_w / 2) + R_w     (core.perf)
                                         the prefill itself: a hit saves its own tokens,
                                         not the new ones' attention over them
    wait_w     = t_w * L_w               the queue before it
    pressure_w = pressure_weight * h_w * E_w * B * t_w * (Ā / A_w) ** turnover_exponent
                                         recompute later of the reuse the evicted blocks
                                         would have served
    cost_w     = wait_w + X_w + (work_w + pressure_w) / (1 - ρ)
                                         X_w: a pulled prefix's transfer (prefix_pull.py),
                                         else 0

Work placed on a worker delays every request that queues behind it; at utilization ρ that
adds about work * ρ / (1 - ρ) of waiting (M/G/1), so work and the recompute it causes weigh
1 / (1 - ρ): on an idle pool this is the request's own TTFT, under load reuse wins over a
shorter queue, because a lost hit costs the whole queue. ρ is the pool's, not the worker's:
the bounded load keeps the workers' loads together, so work placed on any of them ends up
delaying the pool's later requests, wherever they go; a worker's own ρ_w would weigh the
same work less on an idle worker than on a busy one, counting its queue twice (its wait is
already in the cost), and move prompts off the busy workers that cache them.

A block evicted from a cache that turns over slowly has gone unused for long and is less
likely to be asked for again than one at the tail of a cache that churns: the pooled-LRU
oracle evicts the pool's oldest blocks, so new blocks should go where the tail is oldest.
(Ā / A_w) ** turnover_exponent weighs w's evictions by how young its tail is against the
pool's (0: every eviction alike).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from core.perf import PrefillCost
from core.perf.model import KILO
from router.routing.policies.base import RouteContext
from router.routing.worker_state import WorkerState


@dataclass(frozen=True, slots=True)
class Estimate:
    """One worker's terms for one request (seconds, tokens, blocks)."""

    cost: float
    wait: float
    work: float
    """The prefill time the policy places on the worker (its tally's charge)."""
    pressure: float
    uncached: int
    evict: int
    restore: float
    cached_blocks: int
    """c_w: where a pull would start."""
    prefill: PrefillCost
    """The worker's prefill time model: work_w = prefill(U_w, C_w) + R_w."""
    pull_blocks: int = 0
    transfer: float = 0.0

    @property
    def ttft(self) -> float:
        return self.wait + self.transfer + self.work


class Pricing:
    """The pool-wide terms of one decision (ρ, the eviction weights), and the cost formula."""

    __slots__ = ("_cost", "ctx", "inflate", "rho", "youth")

    def __init__(self, cost: TtftCost, ctx: RouteContext) -> None:
        workers = ctx.workers
        self._cost = cost
        self.ctx = ctx
        self.rho = min(sum(w.step_rate.utilization for w in workers) / len(workers),
                       cost.max_utilization)  # fmt: skip
        self.inflate = 1.0 / (1.0 - self.rho)
        self.youth = cost.youth(ctx.tail_age_s)

    def cost_s(self, wait: float, transfer: float, work: float, pressure: float) -> float:
        """cost_w = wait_w + X_w + (work_w + pressure_w) / (1 - ρ)."""
        return wait + transfer + (work + pressure) * self.inflate

    def estimate(self, w: WorkerState) -> Estimate:
        ctx, cost = self.ctx, self._cost
        tokens, block = ctx.num_prompt_tokens, ctx.block_size
        rate = w.step_rate
        t = rate.s_per_token or cost.s_per_token
        a = rate.s_per_pair
        lin = rate.s_per_token_linear if a else t
        c_w = ctx.cached_blocks.get(w.worker_id, 0)
        uncached = max(0, tokens - c_w * block)
        restore = ctx.restore_s.get(w.worker_id, 0.0) if ctx.restore_s else 0.0
        prefill = PrefillCost(cost.step_s, lin, a * KILO)  # core.perf: one step, no chunks
        work = prefill(uncached, tokens - uncached) + restore
        wait = t * w.queued_prefill_tokens
        evict = 0
        if w.total_blocks > 0:
            held = ctx.held_blocks.get(w.worker_id, 0)
            evict = max(0, held + -(-uncached // block) - w.total_blocks)
        pressure = cost.pressure_weight * rate.reuse_rate * evict * block * t
        if evict and self.youth:
            pressure *= self.youth.get(w.worker_id, 1.0)
        total = self.cost_s(wait, 0.0, work, pressure)
        return Estimate(total, wait, work, pressure, uncached, evict, restore, c_w, prefill)


class TtftCost:
    """The cost's parameters; `price(ctx)` gives one decision's Pricing. Pure."""

    def __init__(
        self,
        s_per_token: float,
        step_s: float,
        pressure_weight: float,
        max_utilization: float,
        turnover_exponent: float,
    ) -> None:
        self.s_per_token = s_per_token
        self.step_s = step_s
        self.pressure_weight = pressure_weight
        self.max_utilization = max_utilization
        self.turnover_exponent = turnover_exponent

    def price(self, ctx: RouteContext) -> Pricing:
        return Pricing(self, ctx)

    def youth(self, ages: Mapping[str, float]) -> dict[str, float]:
        """(Ā / A_w) ** turnover_exponent per worker whose tail age is known (empty: all 1)."""
        x = self.turnover_exponent
        if not x or not ages:
            return {}
        mean = sum(ages.values()) / len(ages)
        if mean <= 0:
            return {}
        return {w: (mean / max(age, 1e-3 * mean)) ** x for w, age in ages.items()}
