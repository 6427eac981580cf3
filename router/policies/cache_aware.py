"""Cache-aware prefill policy.

Algorithm (the code below follows it step by step):

    1. Imbalance guard. L_w = queued prefill tokens of worker w (report + routed since).
       If  max L - min L > balance_abs_tokens  and  max L > balance_rel * min L,
       the pool is imbalanced: pick argmin L (ties: fewer running), whatever the cache says.
    2. Otherwise pick the cheapest worker, with
           cost_w = compute_weight * (T - c_w * B)  +  queue_weight * L_w
       T = prompt tokens, c_w = cached prefix blocks on w, B = block size: the first term is
       the prompt tokens w would still compute, the second the prefill work queued before it.
       Ties: smaller L_w, then rotation (so equal workers share the load). Workers with no
       cached block all cost compute_weight*T + queue_weight*L_w, so only the lightest of
       them and the workers holding a prefix are scored: O(hits), not O(pool).

Every decision returns the terms (cost, uncached tokens, queue of the winner, runner-up cost)
so the Router can print them in its debug log line.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.load import WorkerState
from router.policies.base import Choice, Policy, RouteContext, register


@register("cache_aware", pools=("prefill",))
class CacheAwarePrefill(Policy):
    name = "cache_aware"

    def __init__(
        self,
        pool: str = "prefill",
        compute_weight: float = 1.0,
        queue_weight: float = 1.0,
        balance_abs_tokens: int = 32_768,
        balance_rel: float = 2.0,
    ) -> None:
        super().__init__(pool)
        if compute_weight < 0 or queue_weight < 0 or balance_abs_tokens < 0 or balance_rel < 1:
            raise ValueError("weights and balance_abs_tokens must be >= 0, balance_rel >= 1")
        self.compute_weight = compute_weight
        self.queue_weight = queue_weight
        self.balance_abs_tokens = balance_abs_tokens
        self.balance_rel = balance_rel
        self._turn = 0
        self._pos: dict[str, int] = {}
        self._pos_for: Sequence[WorkerState] | None = None

    def choose(self, ctx: RouteContext) -> Choice:
        workers = ctx.workers
        n = len(workers)
        self._turn += 1
        loads = [w.reported_waiting_tokens + w.pending_prefill_tokens for w in workers]
        max_load, min_load = max(loads), min(loads)
        # Equal-load workers take turns: rotate which of them counts as "first".
        lightest = [i for i, load in enumerate(loads) if load == min_load]
        light_i = lightest[self._turn % len(lightest)]

        # 1. Imbalance guard: absolute gap and ratio.
        if max_load - min_load > self.balance_abs_tokens and max_load > self.balance_rel * min_load:
            terms = (("max_load", float(max_load)), ("min_load", float(min_load)))
            return Choice(workers[light_i], "imbalance_least_loaded", terms)

        # 2. cost_w = compute_weight * (T - c_w * B) + queue_weight * L_w
        # A worker without cached blocks costs cw*T + qw*L_w, so among those the lightest
        # wins: only it and the workers with a cached prefix need their cost computed.
        cached = ctx.cached_blocks
        tokens, block = ctx.num_prompt_tokens, ctx.block_size
        cw, qw = self.compute_weight, self.queue_weight
        candidates = [light_i]
        if cached:
            pos = self._positions(workers)
            candidates += [pos[w] for w in cached if w in pos]
        costs = []
        for i in candidates:
            uncached = max(0, tokens - cached.get(workers[i].worker_id, 0) * block)
            costs.append((cw * uncached + qw * loads[i], loads[i], (i - light_i) % n, i))
        costs.sort()
        best_i = costs[0][3]
        winner = workers[best_i]
        hit = cached.get(winner.worker_id, 0)
        terms = (
            ("cost", costs[0][0]),
            ("uncached_tokens", float(max(0, tokens - hit * block))),
            ("cached_blocks", float(hit)),
            ("queued_tokens", float(loads[best_i])),
            ("runner_up_cost", costs[1][0] if len(costs) > 1 else float("inf")),
        )
        return Choice(winner, "cache_aware" if hit else "cache_aware_no_hit", terms)

    def _positions(self, workers: Sequence[WorkerState]) -> dict[str, int]:
        """worker id -> index in the pool; cached per pool list (stable until it changes)."""
        if self._pos_for is not workers:
            self._pos = {w.worker_id: i for i, w in enumerate(workers)}
            self._pos_for = workers
        return self._pos
