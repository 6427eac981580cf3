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
"""

from __future__ import annotations

from router.policies.base import Choice, Policy, RouteContext, register


@register("cache_aware", pools=("decode",))
class CacheAwareDecode(Policy):
    name = "cache_aware"

    def __init__(
        self,
        pool: str = "decode",
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
        max_running = max(w.running for w in workers) + 1
        best, best_key, best_terms = None, (float("inf"), 0), ()
        for k in range(n):
            w = workers[(start + k) % n]
            held = min(ctx.cached_blocks.get(w.worker_id, 0), p)
            need = p - held + out_blocks
            if w.has_capacity_info:
                if w.free_blocks < need:
                    continue
                used = 1.0 - w.free_blocks / w.total_blocks
            else:
                used = 0.0
            xfer = (p - held) / p if p else 0.0
            cost = (
                self.transfer_weight * xfer
                + self.batch_weight * w.running / max_running
                + self.kv_weight * used
            )
            key = (cost, w.running)
            if key < best_key:
                best, best_key = w, key
                best_terms = (
                    ("cost", cost),
                    ("held_blocks", float(held)),
                    ("need_blocks", float(need)),
                    ("running", float(w.running)),
                    ("kv_used", used),
                )
        if best is None:
            roomiest = max(workers, key=lambda w: (w.free_blocks, -w.running))
            terms = (("free_blocks", float(roomiest.free_blocks)),)
            return Choice(roomiest, "decode_no_room_most_free", terms)
        return Choice(best, "cache_aware", best_terms)
