"""Cost-in-time prefill policy: the estimated time to first token, plus the reuse it destroys.

For each request (the code below follows it step by step):

    1. bounded load (bounded_load.py): the candidates are the workers within the bound on
       the prefill time the policy placed on each (tally.py)
    2. cost (cost.py): each candidate's cost_w, in seconds,
           cost_w = t_w * L_w [+ X_w] + (work_w + pressure_w) / (1 - ρ)
       its queue wait, its prefill and the recompute of the reuse its evictions destroy;
       where a peer holds more of the prompt, the pull of it (prefix_pull.py) if that is
       cheaper; then its tier: fits, over the measured bound, or no room for this request
    3. pick (picker.py): the smallest (tier, cost, tally, rotation); where no candidate has
       room, the least loaded after the request
    4. book (tally.py): the winner's tally takes its work_w (work'_w if it pulls); a pull
       goes into the Choice (`PrefixPull(q, c* - c_w)`) and so into the RoutingDecision

Not a weighted Pipeline (policies/pipeline.py): the cost is one formula in seconds, not a sum
of independent terms (the wait is not divided by 1 - ρ, a pull replaces the whole estimate),
and its tie-break is lexicographic over tiers the request's own work decides. So the same
kinds of piece (a filter, a cost, a picker, their bookkeeping) are composed here by hand.

Cost: one pass over the pool per decision (prefill pools are tens of workers). The policy
mutates only its tallies; it reads `ctx` and the WorkerStates. Every decision returns its
terms (cost, ttft, wait, prefill, pressure, utilization, uncached tokens, evicted blocks, the
worker's tally over the mean, runner-up cost, pulled blocks, their transfer time and the
copy back from an offload tier) for the Router's debug log line.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.roles import WorkerRole
from router.routing.decision import PrefixPull
from router.routing.policies.base import Choice, Policy, RouteContext
from router.routing.policies.ttft.bounded_load import BoundedLoad
from router.routing.policies.ttft.cost import TtftCost
from router.routing.policies.ttft.picker import pick
from router.routing.policies.ttft.prefix_pull import Migration
from router.routing.policies.ttft.tally import Tally
from router.routing.worker_state import WorkerState

_TERMS = (
    "cost_s",
    "ttft_s",
    "wait_s",
    "prefill_s",
    "pressure_s",
    "utilization",
    "uncached_tokens",
    "evict_blocks",
    "tally_over_mean",
    "runner_up_cost_s",
    "pull_blocks",
    "transfer_s",
    "restore_s",
)


class TtftPrefill(Policy):
    name = "ttft"
    formula = (
        "cost_w = t_w*L_w [+ X_w: pull c*-c_w blocks] + (s + l_w*U_w + a_w*area(U_w, C_w) + R_w "
        "+ k_p*h_w*E_w*B*t_w*(A/A_w)^x) / (1 - rho) over workers with P_w <= (1+slack)*mean P "
        "[and M_w + t_w*L_w <= (1+slack)*mean]"
    )
    wants_block_counts = True

    def __init__(
        self,
        pool: str = WorkerRole.PREFILL,
        s_per_token: float = 2e-3,
        step_s: float = 0.016,
        pressure_weight: float = 1.0,
        balance_slack: float = 0.2,
        balance_halflife: float = 2000.0,
        balance_measured: bool = False,
        balance_room: bool = True,
        max_utilization: float = 0.95,
        turnover_exponent: float = 0.5,
        kv_bytes_per_token: float = 0.0,
        transfer_gbps: float = 0.0,
        transfer_latency_s: float = 0.0,
    ) -> None:
        super().__init__(pool)
        if s_per_token <= 0 or step_s < 0 or pressure_weight < 0 or balance_slack < 0:
            raise ValueError("s_per_token must be > 0; step_s, weights and slack >= 0")
        if balance_halflife <= 0 or not 0 <= max_utilization < 1:
            raise ValueError("balance_halflife must be > 0, max_utilization in [0, 1)")
        if turnover_exponent < 0:
            raise ValueError("turnover_exponent must be >= 0 (0: every eviction alike)")
        if min(kv_bytes_per_token, transfer_gbps, transfer_latency_s) < 0:
            raise ValueError("kv_bytes_per_token, transfer_gbps, transfer_latency_s must be >= 0")
        self.tally = Tally(balance_halflife)
        self.bounded_load = BoundedLoad(
            self.tally, balance_slack, balance_room, balance_measured, s_per_token
        )
        self.cost = TtftCost(
            s_per_token, step_s, pressure_weight, max_utilization, turnover_exponent
        )
        self.migration = Migration(kv_bytes_per_token, transfer_gbps, transfer_latency_s)
        self._turn = 0

    def set_kv_bytes_per_token(self, num_bytes: float) -> None:
        self.migration.set_kv_bytes_per_token(num_bytes)

    def choose(self, ctx: RouteContext) -> Choice:
        workers = ctx.workers
        self._turn += 1
        start = self._turn % len(workers)
        # 1. bounded load: the tallies before this decision
        bound = self.bounded_load.bound(workers)
        candidates = bound.candidates()
        assert candidates, "the lightest tally is never over the mean"
        # 2. each candidate's cost, a pull where cheaper, and its tier
        pricing = self.cost.price(ctx)
        source = self.migration.source(ctx)
        estimates = [
            self.migration.cheaper(pricing.estimate(workers[j]), source, pricing)
            for j in candidates
        ]
        tiers = [bound.tier(j, est.work) for j, est in zip(candidates, estimates, strict=True)]
        # 3. pick
        k, runner_up = pick(candidates, estimates, tiers, bound, start)
        j, est = candidates[k], estimates[k]
        winner = workers[j]
        # 4. book
        self.tally.place(workers, winner.worker_id, est.work)
        values = (
            est.cost, est.ttft, est.wait, est.work, est.pressure, pricing.rho,
            float(est.uncached), float(est.evict), bound.over_mean(j), runner_up,
            float(est.pull_blocks), est.transfer, est.restore,
        )  # fmt: skip
        if est.pull_blocks:
            assert source is not None and source.peer_id is not None
            pulled = PrefixPull(source.peer_id, est.pull_blocks)
            return Choice(winner, "ttft_pull", _TERMS, values, pulled, est.work)
        reason = "ttft" if ctx.cached_blocks.get(winner.worker_id, 0) else "ttft_no_hit"
        return Choice(winner, reason, _TERMS, values, None, est.work)

    def placed_elsewhere(
        self, workers: Sequence[WorkerState], worker_id: str, placed_s: float
    ) -> None:
        if any(w.worker_id == worker_id for w in workers):
            self.tally.place(workers, worker_id, placed_s)
