"""Filters: which workers of the pool a decision scores at all.

imbalance_guard   L_w = queued prefill tokens of w (router.routing.load). If
                      max L - min L > balance_abs_tokens  and  max L > balance_rel * min L
                  the pool is out of balance: settle on the lightest worker (equal ones
                  take turns), whatever the cache says (SGLang's router: absolute gap and
                  ratio). Otherwise keep every candidate.
cache_candidates  A worker that caches none of the prompt costs the same prompt tokens as
                  any other such worker, so only the lightest of them can win: keep the
                  lightest worker (equal ones take turns) and the workers caching a
                  prefix. Where part of a prefix is in an offload tier (ctx.restore_s), a
                  hit may cost more than none: keep the lightest worker caching nothing
                  too. O(hits), not O(pool): min, max and the lightest come from the
                  pool's sorted load order (router.routing.pool).
has_room          A decode worker must reserve the prompt's blocks it does not hold and
                  the output's:  need_w = (P - h_w) + ceil(O / B)  (P prompt blocks, h_w
                  held, O expected output tokens, B block size). Keep the workers with
                  free_w >= need_w (a worker that never reported its capacity always
                  fits); if none fits, settle on the one with the most free blocks (ties:
                  fewer running): it will queue or preempt.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.policies.base import Choice
from router.routing.policies.plugin import Candidates, Filter, plugin
from router.routing.worker_state import WorkerState

_GUARD_TERMS = ("max_load", "min_load")
_NO_ROOM_TERMS = ("free_blocks",)


@plugin("imbalance_guard")
class ImbalanceGuard(Filter):
    def __init__(self, balance_abs_tokens: int = 32_768, balance_rel: float = 2.0) -> None:
        if balance_abs_tokens < 0 or balance_rel < 1:
            raise ValueError("balance_abs_tokens must be >= 0, balance_rel >= 1")
        self.balance_abs_tokens = balance_abs_tokens
        self.balance_rel = balance_rel

    def filter(self, cands: Candidates) -> Sequence[int] | Choice:
        pool = cands.pool
        max_load, min_load = pool.max_load, pool.min_load
        if max_load - min_load > self.balance_abs_tokens and max_load > self.balance_rel * min_load:
            values = (float(max_load), float(min_load))
            worker = cands.ctx.workers[cands.lightest()]
            return Choice(worker, "imbalance_least_loaded", _GUARD_TERMS, values)
        return cands.positions


@plugin("cache_candidates")
class CacheCandidates(Filter):
    def filter(self, cands: Candidates) -> Sequence[int] | Choice:
        ctx, pool = cands.ctx, cands.pool
        light = cands.lightest()
        kept = [light]
        position = pool.position
        for worker_id in ctx.cached_blocks:
            i = position.get(worker_id)
            if i is not None and i != light:  # outside this pool, or kept already
                kept.append(i)
        if ctx.restore_s:  # a hit in a slow tier may cost more than none
            j = pool.lightest_without(ctx.cached_blocks)
            if j is not None and j != light:
                kept.append(j)
        return kept


def need_blocks(held: int, num_prompt_blocks: int, num_output_blocks: int) -> int:
    """need_w: the blocks a decode worker holding `held` of the prompt must reserve."""
    return num_prompt_blocks - held + num_output_blocks


def held_blocks(cands: Candidates, worker: WorkerState) -> int:
    """h_w: the prompt's blocks the worker holds (its cached prefix, at most the prompt)."""
    held = cands.ctx.cached_blocks.get(worker.worker_id, 0)
    return min(held, cands.ctx.num_prompt_blocks)


def output_blocks(cands: Candidates) -> int:
    """ceil(O / B): the blocks the expected output takes."""
    return -(-cands.ctx.num_output_tokens // cands.ctx.block_size)


@plugin("has_room")
class HasRoom(Filter):
    def filter(self, cands: Candidates) -> Sequence[int] | Choice:
        workers = cands.ctx.workers
        p, out = cands.ctx.num_prompt_blocks, output_blocks(cands)
        kept = [
            i
            for i in cands.positions
            if workers[i].total_blocks <= 0  # never reported its capacity
            or workers[i].free_blocks >= need_blocks(held_blocks(cands, workers[i]), p, out)
        ]
        if kept:
            return kept
        roomiest = max(workers, key=lambda w: (w.free_blocks, -w.running))
        values = (float(roomiest.free_blocks),)
        return Choice(roomiest, "decode_no_room_most_free", _NO_ROOM_TERMS, values)
