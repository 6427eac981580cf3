"""Cost-in-time prefill policy: the estimated time to first token, plus the reuse it destroys.

Algorithm (the code below follows it step by step). For each prefill worker w:

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

    1. work_w     = s + l_w * U_w + a_w * U_w * (C_w + U_w / 2) + R_w     (core.perf)
                                                           the prefill itself: a hit saves
                                                           its own tokens, not the new
                                                           ones' attention over them
       ttft_w     = t_w * L_w + work_w                     queue wait + prefill
       pressure_w = pressure_weight * h_w * E_w * B * t_w * (Ā / A_w) ** turnover_exponent
                                                           recompute later of the reuse the
                                                           evicted blocks would have served
       cost_w     = t_w * L_w + (work_w + pressure_w) / (1 - ρ)            (seconds)

       Prefix migration (only with a transfer bandwidth: `kv_bytes_per_token` and
       `transfer_gbps`, the KV transport's measured rate between prefill workers). Let
       c* be the longest cached prefix on any worker, held by peer q (ties: the shorter
       queue). A worker with c_w < c* may instead pull blocks [c_w, c*) from q:

       X_w        = x0 + (c* - c_w) * B * kv_bytes_per_token / transfer_gbps   transfer
       U'_w       = max(0, T - c* * B),  work'_w = work_w with U'_w for U_w
       cost'_w    = t_w * L_w + X_w + (work'_w + pressure_w) / (1 - ρ)

       and takes it when cost'_w < cost_w. X_w is added to the wait, not divided by
       1 - ρ: the copy occupies the transport, not w's compute, so it delays no one
       queued behind. (An upper bound: a copy that overlaps the queue wait costs less.)
       E_w is unchanged (the pulled blocks are stored on w too). When q is busy, a worker
       with a short queue pulls q's prefix instead of recomputing it or queueing behind q;
       when the bound below takes q out, hot prefixes get copied to the workers that take
       their overflow: replication under load, with no separate mechanism.

       Work placed on a worker delays every request that queues behind it; at utilization ρ
       that adds about work * ρ / (1 - ρ) of waiting (M/G/1), so work and the recompute it
       causes weigh 1 / (1 - ρ): on an idle pool this is the request's own TTFT, under load
       reuse wins over a shorter queue, because a lost hit costs the whole queue.
       ρ is the pool's, not the worker's: the bound below keeps the workers' loads
       together, so work placed on any of them ends up delaying the pool's later requests,
       wherever they go; a worker's own ρ_w would weigh the same work less on an idle worker
       than on a busy one, counting its queue twice (its wait is already in the cost): in
       the simulator's saturating bursts that moved prompts off the busy workers caching
       them (docs/performance.md, issue 20).

       A block evicted from a cache that turns over slowly has gone unused for long and is
       less likely to be asked for again than one at the tail of a cache that churns: the
       pooled-LRU oracle evicts the pool's oldest blocks, so new blocks should go where the
       tail is oldest. (Ā / A_w) ** turnover_exponent weighs w's evictions by how young
       its tail is against the pool's. In the simulator (bench.router_sweep, Mooncake at
       150 / 600 / 2000 blocks, 11 loads each) exponent 0.5 lifts reuse / oracle from 0.901
       / 0.958 / 0.950 on average (0: off) to 0.928 / 0.955 / 0.963; 1 goes further on
       Mooncake (0.933 / 0.952 / 0.970) but costs the light-then-burst pattern its reuse
       (routed at arrival: 0.84 against 0.91 at 0.5 and 0.89 at 0).
    2. Bounded load (consistent hashing with bounded loads): every worker has a decayed
       tally P_w of the prefill time this policy placed on it (half-life
       `balance_halflife` decisions). Only workers with  P_w <= (1 + balance_slack) * mean P
       are candidates, so no prefix, however popular, pins the pool to one worker, even
       while no queue has formed yet to push back (the "light then burst" pattern, or a
       first block every prompt shares). With `balance_room` (the default), as in
       consistent hashing with bounded loads, the request's own work counts too: a worker
       it would take over the bound (P_w + work_w > (1 + balance_slack) * mean of the
       tallies with it; a worker with nothing placed always has room for one) comes after
       every worker it fits, and among such workers the least loaded after it wins, not the
       cheapest, so a long prompt no worker has room for goes where it overshoots least.
       (Checked before the placement only, a long prompt's whole work could land on a
       worker just under the bound: in the simulator's Mooncake runs at 600 / 2000 blocks
       the largest max/mean was 1.27 / 1.26, with it 1.16 / 1.16.)
       Router replicas count each other's placements: each decision's work_w reaches the
       other replicas with its load share (router.routing.load_share) and goes into their
       P_w there (`placed_elsewhere`), a decay step included, so every replica bounds the
       pool's placements. Each counting only its own, four replicas held a quarter of the
       pool's tallies each: a request was 4x larger against them and overflowed 4x as
       often (the light-then-burst pattern: +8.6% computed against one router).
       With `balance_measured` a candidate must also be within the same bound on the work
       it was measured to do: M_w, the engine seconds its reports add between decisions,
       decayed alike, plus t_w * L_w for what it has queued. P_w counts estimates made at
       routing time; what a worker then computes differs (a hit evicted while it queued, a
       pull's copy, attention the estimate misses), and the load the workers end with is
       theirs, not the estimates'. M_w alone lags (a report comes after the work), so both
       bounds hold; where no worker is within both, the ones within P_w's are the
       candidates (the lightest P_w always is).
    3. Pick the candidate with the smallest cost (ties: smaller tally, then pool order from a
       rotating start); add its work_w (work'_w if it pulls) to its tally. A pull goes into
       the Choice (`PrefixPull(q, c* - c_w)`) and so into the RoutingDecision.

Cost: one pass over the pool per decision (prefill pools are tens of workers). The policy
mutates only its own tallies; it reads `ctx` and the WorkerStates. Every decision returns
its terms (cost, ttft, wait, prefill, pressure, uncached tokens, evicted blocks, the
worker's tally over the mean, runner-up cost, pulled blocks and their transfer time) for the
Router's debug log line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from core.perf import PrefillCost
from core.perf.model import KILO, TransferCost
from core.roles import WorkerRole
from router.routing.decision import PrefixPull
from router.routing.policies.base import Choice, Policy, RouteContext, register
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


@register("ttft", pools=(WorkerRole.PREFILL,))
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
        self.turnover_exponent = turnover_exponent
        if min(kv_bytes_per_token, transfer_gbps, transfer_latency_s) < 0:
            raise ValueError("kv_bytes_per_token, transfer_gbps, transfer_latency_s must be >= 0")
        self.max_utilization = max_utilization
        self.transfer_gbps = transfer_gbps
        self.transfer_latency_s = transfer_latency_s
        self.transfer = TransferCost(transfer_latency_s, 0.0)
        """Seconds to copy KV between prefill workers (per token 0: no migration)."""
        self.set_kv_bytes_per_token(kv_bytes_per_token)
        self.s_per_token = s_per_token
        self.step_s = step_s
        self.pressure_weight = pressure_weight
        self.balance_slack = balance_slack
        self._decay = 0.5 ** (1.0 / balance_halflife)
        self.balance_measured = balance_measured
        self.balance_room = balance_room
        self._tally: dict[str, float] = {}
        self._measured: dict[str, float] = {}
        """M_w: decayed engine seconds from the workers' reports."""
        self._seen_busy: dict[str, float] = {}
        """Each worker's lifetime engine seconds at the last decision (StepRate.busy_s)."""
        self._turn = 0

    def _over_measured(self, workers: Sequence[WorkerState]) -> list[int]:
        """1 for each worker whose M_w + t_w * L_w is over the bound, else 0, after adding its
        engine seconds since the last decision to M_w (a restarted worker's total starts
        again)."""
        measured, seen = self._measured, self._seen_busy
        loads: list[float] = []
        for w in workers:
            wid, rate = w.worker_id, w.step_rate
            last = seen.get(wid)
            if last is not None and rate.busy_s > last:
                measured[wid] = measured.get(wid, 0.0) + rate.busy_s - last
            seen[wid] = rate.busy_s
            t = rate.s_per_token or self.s_per_token
            loads.append(measured.get(wid, 0.0) + t * w.queued_prefill_tokens)
        # Until some worker has reported work there is nothing measured to balance: queues
        # alone would put any worker with one over the mean of a pool just started.
        if not any(measured.get(w.worker_id) for w in workers):
            return [0] * len(workers)
        bound = (1.0 + self.balance_slack) * sum(loads) / len(loads)
        return [1 if load > bound else 0 for load in loads]

    def set_kv_bytes_per_token(self, num_bytes: float) -> None:
        self.transfer = TransferCost.at_rate(num_bytes, self.transfer_gbps, self.transfer_latency_s)

    def choose(self, ctx: RouteContext) -> Choice:
        workers = ctx.workers
        n = len(workers)
        self._turn += 1
        start = self._turn % n
        tokens, block = ctx.num_prompt_tokens, ctx.block_size
        cached, held, restore_s = ctx.cached_blocks, ctx.held_blocks, ctx.restore_s
        kp, step_s = self.pressure_weight, self.step_s
        tally = self._tally
        tallies = [tally.get(w.worker_id, 0.0) for w in workers]
        peer, top = self._holder(ctx) if self.transfer.per_token else (None, 0)
        top_uncached = max(0, tokens - top * block)
        total = sum(tallies)
        room = 1.0 + self.balance_slack
        bound = room * total / n
        over_measured = self._over_measured(workers) if self.balance_measured else [0] * n
        best_key: tuple[int, float, float, int] | None = None
        best_i, best_terms, best_pull, best_cost = 0, (), (0, 0.0, 0.0), 0.0
        runner_up = float("inf")
        costs: list[tuple[int, float]] = []
        rho = min(sum(w.step_rate.utilization for w in workers) / n, self.max_utilization)
        inflate = 1.0 / (1.0 - rho)
        youth = self._youth(ctx.tail_age_s)
        for j, w in enumerate(workers):
            # 1. the worker's estimated TTFT and the reuse its placement destroys
            rate = w.step_rate
            t = rate.s_per_token or self.s_per_token
            a = rate.s_per_pair
            lin = rate.s_per_token_linear if a else t
            c_w = cached.get(w.worker_id, 0)
            uncached = max(0, tokens - c_w * block)
            restore = restore_s.get(w.worker_id, 0.0) if restore_s else 0.0
            prefill = PrefillCost(step_s, lin, a * KILO)  # core.perf: one step, no chunks
            work = prefill(uncached, tokens - uncached) + restore
            wait = t * w.queued_prefill_tokens
            evict = 0
            if w.total_blocks > 0:
                evict = max(0, held.get(w.worker_id, 0) + -(-uncached // block) - w.total_blocks)
            pressure = kp * w.step_rate.reuse_rate * evict * block * t
            if evict and youth:
                pressure *= youth.get(w.worker_id, 1.0)
            cost = wait + (work + pressure) * inflate
            pull, transfer = 0, 0.0
            if top > c_w:  # a peer holds more of the prompt: copying it may beat computing
                x = self.transfer((top - c_w) * block)
                work_pull = prefill(top_uncached, tokens - top_uncached) + restore
                cost_pull = wait + x + (work_pull + pressure) * inflate
                if cost_pull < cost:
                    cost, work, uncached = cost_pull, work_pull, top_uncached
                    pull, transfer = top - c_w, x
            # 2. bounded load: over the bound before this request, never a candidate; with
            # `balance_room`, over it with the request, after every worker it fits, least
            # loaded after it first (within the measured bound before over it); over the
            # measured one only, after those within both
            if tallies[j] > bound:
                over = 3
            elif self.balance_room and tallies[j] + work > max(room * (total + work) / n, work):
                over = 2
            else:
                over = over_measured[j]
            if over == 2:  # least loaded after it, those within the measured bound first
                key = (2, over_measured[j] + 0.0, tallies[j] + work, (j - start) % n)
            else:
                key = (over, cost, tallies[j], (j - start) % n)
            costs.append((over, cost))
            if best_key is None or key < best_key:
                best_i, best_key, best_cost = j, key, cost
                best_terms = (wait + transfer + work, wait, work, pressure, rho, uncached, evict)
                best_pull = (pull, transfer, restore)
        # 3. the lightest tally is never over the mean, so a candidate always won
        assert best_key is not None and best_key[0] < 3
        for j, (over, cost) in enumerate(costs):
            if over == best_key[0] and j != best_i:
                runner_up = min(runner_up, cost)
        winner = workers[best_i]
        placed = best_terms[2]
        self._place(workers, winner.worker_id, placed)
        mean = sum(tallies) / n
        values = (
            best_cost,
            *best_terms[:5],
            float(best_terms[5]),
            float(best_terms[6]),
            tallies[best_i] / mean if mean > 0 else 1.0,
            runner_up,
            float(best_pull[0]),
            best_pull[1],
            best_pull[2],
        )
        if best_pull[0]:
            assert peer is not None
            pulled = PrefixPull(peer, best_pull[0])
            return Choice(winner, "ttft_pull", _TERMS, values, pulled, placed)
        reason = "ttft" if cached.get(winner.worker_id, 0) else "ttft_no_hit"
        return Choice(winner, reason, _TERMS, values, None, placed)

    def placed_elsewhere(
        self, workers: Sequence[WorkerState], worker_id: str, placed_s: float
    ) -> None:
        if any(w.worker_id == worker_id for w in workers):
            self._place(workers, worker_id, placed_s)

    def _place(self, workers: Sequence[WorkerState], worker_id: str, placed_s: float) -> None:
        """One decision of the pool's, here or in another replica: every tally decays a
        step, the chosen worker's takes the work placed on it."""
        decay, tally, measured = self._decay, self._tally, self._measured
        for w in workers:
            wid = w.worker_id
            tally[wid] = tally.get(wid, 0.0) * decay
            if wid in measured:
                measured[wid] *= decay
        tally[worker_id] += placed_s
        if len(tally) > 2 * len(workers):  # workers that left the pool
            live = {w.worker_id for w in workers}
            for table in (tally, measured, self._seen_busy):
                for wid in [k for k in table if k not in live]:
                    del table[wid]

    def _youth(self, ages: Mapping[str, float]) -> dict[str, float]:
        """(Ā / A_w) ** turnover_exponent per worker whose tail age is known (empty: all 1)."""
        x = self.turnover_exponent
        if not x or not ages:
            return {}
        mean = sum(ages.values()) / len(ages)
        if mean <= 0:
            return {}
        return {w: (mean / max(age, 1e-3 * mean)) ** x for w, age in ages.items()}

    @staticmethod
    def _holder(ctx: RouteContext) -> tuple[str | None, int]:
        """The pool worker holding the longest cached prefix of the prompt, and its length in
        blocks (ties: the shorter queue, which serves a copy soonest on a real transport).
        Only reported blocks count: a block still being computed cannot be sent yet."""
        best: tuple[int, int] = (0, 0)
        holder = None
        in_pool = {w.worker_id: w for w in ctx.workers}
        reported = ctx.cached_blocks if ctx.reported_blocks is None else ctx.reported_blocks
        for worker_id, hit in reported.items():
            w = in_pool.get(worker_id)
            if w is not None and hit > 0 and (hit, -w.queued_prefill_tokens) > best:
                best, holder = (hit, -w.queued_prefill_tokens), worker_id
        return holder, best[0]
