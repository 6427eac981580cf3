"""Scorers and costs, each one term of a policy's formula.

load_rank       (score)  rank of w's load (policies.base.pool_load: queued prefill tokens
                         then running in the prefill pool; running then free blocks in
                         the decode pool) among the candidates': the lightest 1, the
                         heaviest 0. A rank, not the load itself, so the tie-break on the
                         second part of the load carries into the score.
compute_tokens  (cost)   T - c_w * B + R_w / t_w: the prompt tokens w would still compute
                         (T prompt tokens, c_w cached prefix blocks, B block size), plus
                         the copy back of the part of its prefix only an offload tier
                         holds, R_w seconds (ctx.restore_s), in tokens of w's prefill at
                         its speed t_w (calibrated s/token, router.routing.step_rate, or
                         the prior `s_per_token`). Can exceed T (a slow tier).
queued_tokens   (cost)   L_w: prefill tokens queued before this request, as the pool files
                         them (router.routing.pool).
transfer_share  (cost)   (P - h_w) / P: the share of the prompt's blocks the decode worker
                         does not hold (multi-turn chat keeps them: they are not sent
                         again).
batch_share     (cost)   running_w / (max running in the pool + 1): its batch against the
                         pool's busiest (one pass over the pool: the decode pool is small).
kv_used         (cost)   1 - free_w / total_w: its KV cache in use (0 before it reports).
"""

from __future__ import annotations

from collections.abc import Mapping

from router.routing.policies.base import pool_load
from router.routing.policies.filters import held_blocks, need_blocks, output_blocks
from router.routing.policies.plugin import Candidates, Cost, Scorer, plugin
from router.routing.worker_state import WorkerState


@plugin("load_rank")
class LoadRank(Scorer):
    term_names = ("load",)

    def __init__(self, pool: str) -> None:
        self.pool = pool

    def score(self, cands: Candidates) -> list[float]:
        workers, pool = cands.ctx.workers, self.pool
        loads = [pool_load(workers[i], pool) for i in cands.positions]
        ranks = {load: r for r, load in enumerate(sorted(set(loads)))}
        top = len(ranks) - 1
        return [1.0 - ranks[load] / top if top else 1.0 for load in loads]

    def terms(self, cands: Candidates, i: int) -> tuple[float, ...]:
        return (float(pool_load(cands.ctx.workers[i], self.pool)[0]),)


@plugin("compute_tokens")
class ComputeTokens(Cost):
    term_names = ("uncached_tokens", "cached_blocks", "restore_tokens")

    def __init__(self, s_per_token: float = 2e-3) -> None:
        if s_per_token <= 0:
            raise ValueError("s_per_token must be > 0")
        self.s_per_token = s_per_token

    def score(self, cands: Candidates) -> list[float]:
        ctx = cands.ctx
        tokens, block, cached, restore_s = (
            ctx.num_prompt_tokens, ctx.block_size, ctx.cached_blocks, ctx.restore_s
        )  # fmt: skip
        costs = []
        for i in cands.positions:
            w = ctx.workers[i]
            uncached = tokens - cached.get(w.worker_id, 0) * block
            restore = self._restore_tokens(w, restore_s) if restore_s else 0.0
            costs.append((uncached if uncached > 0 else 0) + restore)
        return costs

    def terms(self, cands: Candidates, i: int) -> tuple[float, ...]:
        ctx = cands.ctx
        w = ctx.workers[i]
        hit = ctx.cached_blocks.get(w.worker_id, 0)
        restore = self._restore_tokens(w, ctx.restore_s) if ctx.restore_s else 0.0
        return (float(max(0, ctx.num_prompt_tokens - hit * ctx.block_size)), float(hit), restore)

    def _restore_tokens(self, worker: WorkerState, restore_s: Mapping[str, float]) -> float:
        """R_w / t_w: the copy back of w's offloaded prefix, in tokens of w's prefill."""
        seconds = restore_s.get(worker.worker_id, 0.0)
        return seconds / (worker.step_rate.s_per_token or self.s_per_token) if seconds else 0.0


@plugin("queued_tokens")
class QueuedTokens(Cost):
    term_names = ("queued_tokens",)

    def score(self, cands: Candidates) -> list[float]:
        loads = cands.pool.loads
        return [loads[i] for i in cands.positions]

    def terms(self, cands: Candidates, i: int) -> tuple[float, ...]:
        return (float(cands.pool.loads[i]),)


@plugin("transfer_share")
class TransferShare(Cost):
    term_names = ("held_blocks", "need_blocks")

    def score(self, cands: Candidates) -> list[float]:
        workers, p = cands.ctx.workers, cands.ctx.num_prompt_blocks
        if not p:
            return [0.0] * len(cands.positions)
        return [(p - held_blocks(cands, workers[i])) / p for i in cands.positions]

    def terms(self, cands: Candidates, i: int) -> tuple[float, ...]:
        held = held_blocks(cands, cands.ctx.workers[i])
        need = need_blocks(held, cands.ctx.num_prompt_blocks, output_blocks(cands))
        return (float(held), float(need))


@plugin("batch_share")
class BatchShare(Cost):
    term_names = ("running",)

    def score(self, cands: Candidates) -> list[float]:
        workers = cands.ctx.workers
        max_running = max([w.running for w in workers]) + 1
        return [workers[i].running / max_running for i in cands.positions]

    def terms(self, cands: Candidates, i: int) -> tuple[float, ...]:
        return (float(cands.ctx.workers[i].running),)


def kv_used(worker: WorkerState) -> float:
    return 1.0 - worker.free_blocks / worker.total_blocks if worker.total_blocks > 0 else 0.0


@plugin("kv_used")
class KvUsed(Cost):
    term_names = ("kv_used",)

    def score(self, cands: Candidates) -> list[float]:
        workers = cands.ctx.workers
        return [kv_used(workers[i]) for i in cands.positions]

    def terms(self, cands: Candidates, i: int) -> tuple[float, ...]:
        return (kv_used(cands.ctx.workers[i]),)
