"""Cache-aware prefill policy.

Algorithm (the code below follows it step by step):

    1. Imbalance guard. L_w = queued prefill tokens of worker w (report + routed since).
       If  max L - min L > balance_abs_tokens  and  max L > balance_rel * min L,
       the pool is imbalanced: pick argmin L (ties: fewer running), whatever the cache says.
    2. Otherwise pick the cheapest worker, with
           cost_w = compute_weight * (T - c_w * B)  +  queue_weight * L_w
       T = prompt tokens, c_w = cached prefix blocks on w, B = block size: the first term is
       the prompt tokens w would still compute, the second the prefill work queued before it.
       Where part of w's prefix is only in an offload tier, copying it back takes R_w seconds
       (ctx.restore_s), worth R_w / t_w tokens of prefill at w's speed t_w (its calibrated
       s/token, router.routing.step_rate, or the prior `s_per_token`): the first term
       becomes  compute_weight * (T - c_w * B + R_w / t_w), which can exceed T (a slow tier),
       so then the lightest worker holding nothing is scored too.
       Ties: smaller L_w, then rotation (so equal workers share the load). Workers with no
       cached block all cost compute_weight*T + queue_weight*L_w, so only the lightest of
       them and the workers holding a prefix are scored: O(hits), not O(pool). min / max /
       lightest L come from the pool's sorted load order (router.routing.pool), not a scan.

Every decision returns the terms (cost, uncached tokens, queue of the winner, runner-up cost)
so the Router can print them in its debug log line.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from core.roles import WorkerRole
from router.routing.policies.base import Choice, Policy, RouteContext, register
from router.routing.worker_state import WorkerState

_GUARD_TERMS = ("max_load", "min_load")
_COST_TERMS = (
    "cost",
    "uncached_tokens",
    "cached_blocks",
    "queued_tokens",
    "runner_up_cost",
    "restore_tokens",
)


@register("cache_aware", pools=(WorkerRole.PREFILL,))
class CacheAwarePrefill(Policy):
    name = "cache_aware"
    formula = "cost_w = w_c*(T - c_w*B + R_w/t_w) + w_q*L_w"

    def __init__(
        self,
        pool: str = WorkerRole.PREFILL,
        compute_weight: float = 1.0,
        queue_weight: float = 1.0,
        balance_abs_tokens: int = 32_768,
        balance_rel: float = 2.0,
        s_per_token: float = 2e-3,
    ) -> None:
        super().__init__(pool)
        if compute_weight < 0 or queue_weight < 0 or balance_abs_tokens < 0 or balance_rel < 1:
            raise ValueError("weights and balance_abs_tokens must be >= 0, balance_rel >= 1")
        if s_per_token <= 0:
            raise ValueError("s_per_token must be > 0")
        self.s_per_token = s_per_token
        self.compute_weight = compute_weight
        self.queue_weight = queue_weight
        self.balance_abs_tokens = balance_abs_tokens
        self.balance_rel = balance_rel
        self._turn = 0

    def choose(self, ctx: RouteContext) -> Choice:
        pool = ctx.pool_view()
        workers = pool.workers
        n = len(workers)
        self._turn += 1
        max_load, min_load = pool.max_load, pool.min_load
        # Equal-load workers take turns: rotate which of them counts as "first".
        light_i = pool.lightest(self._turn)

        # 1. Imbalance guard: absolute gap and ratio.
        if max_load - min_load > self.balance_abs_tokens and max_load > self.balance_rel * min_load:
            values = (float(max_load), float(min_load))
            return Choice(workers[light_i], "imbalance_least_loaded", _GUARD_TERMS, values)

        # 2. cost_w = compute_weight * (T - c_w * B) + queue_weight * L_w
        # A worker without cached blocks costs cw*T + qw*L_w, so among those the lightest
        # wins: only it and the workers with a cached prefix need their cost computed.
        # The minimum of key (cost, L_w, rotation from light_i) wins; no list, no sort.
        tokens, block = ctx.num_prompt_tokens, ctx.block_size
        cw, qw = self.compute_weight, self.queue_weight
        cached, restore_s = ctx.cached_blocks, ctx.restore_s
        best_i, best_load = light_i, min_load
        best_hit = cached.get(workers[light_i].worker_id, 0)
        best_restore = self._restore_tokens(workers[light_i], restore_s) if restore_s else 0.0
        best_cost = cw * (max(0, tokens - best_hit * block) + best_restore) + qw * min_load
        runner_up = float("inf")
        position, loads = pool.position, pool.loads
        scored: Iterable[tuple[str, int]] = cached.items()
        if restore_s:  # a hit in a slow tier may cost more than none
            j = pool.lightest_without(cached)
            if j is not None:
                scored = itertools.chain(scored, ((workers[j].worker_id, 0),))
        for worker_id, hit in scored:
            i = position.get(worker_id)
            if i is None or i == light_i:  # outside this pool, or scored above
                continue
            uncached = tokens - hit * block
            load_i = loads[i]
            restore = self._restore_tokens(workers[i], restore_s) if restore_s else 0.0
            cost = cw * ((uncached if uncached > 0 else 0) + restore) + qw * load_i
            if cost < best_cost or (
                cost == best_cost
                and (load_i, (i - light_i) % n) < (best_load, (best_i - light_i) % n)
            ):
                runner_up = best_cost
                best_i, best_hit, best_load, best_cost = i, hit, load_i, cost
                best_restore = restore
            elif cost < runner_up:
                runner_up = cost
        values = (
            best_cost,
            float(max(0, tokens - best_hit * block)),
            float(best_hit),
            float(best_load),
            runner_up,
            best_restore,
        )
        reason = "cache_aware" if best_hit else "cache_aware_no_hit"
        return Choice(workers[best_i], reason, _COST_TERMS, values)

    def _restore_tokens(self, worker: WorkerState, restore_s: Mapping[str, float]) -> float:
        """R_w / t_w: the copy back of w's offloaded prefix, in tokens of w's prefill."""
        seconds = restore_s.get(worker.worker_id, 0.0)
        return seconds / (worker.step_rate.s_per_token or self.s_per_token) if seconds else 0.0
