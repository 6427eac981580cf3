"""Cache-aware decode policy.

A decode worker must reserve blocks for the prompt (minus the blocks of it it already holds:
multi-turn chat keeps them, they are not sent again) and for the output, then carry the
request in its running batch. Algorithm:

    need_w = (P - h_w) + ceil(O / B)          blocks to reserve (P prompt blocks, h_w held,
                                              O expected output tokens, B block size)
    feasible_w = free_w >= need_w             (always true for a worker that never reported)
    cost_w = transfer_weight * (P - h_w) / P
           + batch_weight    * running_w / (max running in pool + 1)
           + kv_weight       * (1 - free_w / total_w)
    pick the cheapest feasible worker (ties: fewer running, then rotation);
    if none is feasible, the one with the most free blocks (it will queue or preempt).

Every worker's cost depends on the pool-wide max running, so this is one pass over the pool
(the decode pool is the small one); the terms are built for the winner only.
"""

from __future__ import annotations

from core.roles import WorkerRole
from router.routing.policies.base import Choice, Policy, RouteContext, register

_TERMS = ("cost", "held_blocks", "need_blocks", "running", "kv_used")
_NO_ROOM_TERMS = ("free_blocks",)


@register("cache_aware", pools=(WorkerRole.DECODE,))
class CacheAwareDecode(Policy):
    name = "cache_aware"

    def __init__(
        self,
        pool: str = WorkerRole.DECODE,
        transfer_weight: float = 1.0,
        batch_weight: float = 1.0,
        kv_weight: float = 1.0,
    ) -> None:
        super().__init__(pool)
        if min(transfer_weight, batch_weight, kv_weight) < 0:
            raise ValueError("decode policy weights must be >= 0")
        self.transfer_weight = transfer_weight
        self.batch_weight = batch_weight
        self.kv_weight = kv_weight
        self._turn = 0

    def choose(self, ctx: RouteContext) -> Choice:
        workers = ctx.workers
        n = len(workers)
        self._turn += 1
        start = self._turn % n
        p = ctx.num_prompt_blocks
        out_blocks = -(-ctx.num_output_tokens // ctx.block_size)
        cached = ctx.cached_blocks
        tw, bw, kw = self.transfer_weight, self.batch_weight, self.kv_weight
        # WorkerState's properties, inlined: this loop is the one O(pool) part of a decision.
        max_running = max([w.reported_running + w.pending_requests for w in workers]) + 1
        best, best_held, best_used = None, 0, 0.0
        best_key = (float("inf"), 0, 0)
        for j, w in enumerate(workers):
            held = cached.get(w.worker_id, 0)
            if held > p:
                held = p
            if w.total_blocks > 0:  # it has reported its capacity
                free = w.reported_free_blocks - w.pending_blocks
                if free < 0:
                    free = 0
                if free < p - held + out_blocks:
                    continue
                used = 1.0 - free / w.total_blocks
            else:
                used = 0.0
            running = w.reported_running + w.pending_requests
            cost = tw * ((p - held) / p if p else 0.0) + bw * running / max_running + kw * used
            # ties: fewer running, then rotation from `start`
            key = (cost, running, (j - start) % n)
            if key < best_key:
                best, best_key, best_held, best_used = w, key, held, used
        if best is None:
            roomiest = max(workers, key=lambda w: (w.free_blocks, -w.running))
            return Choice(
                roomiest, "decode_no_room_most_free", _NO_ROOM_TERMS, (float(roomiest.free_blocks),)
            )
        values = (
            best_key[0],
            float(best_held),
            float(p - best_held + out_blocks),
            float(best_key[1]),
            best_used,
        )
        return Choice(best, "cache_aware", _TERMS, values)
