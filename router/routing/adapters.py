"""Which workers a request under a LoRA adapter may go to.

A worker runs a request under an adapter only with the adapter in one of its slots: one
that holds it serves at once; one with a free slot loads it (a read of the folder, a copy
per layer); a full one evicts its least recently used adapter first. So, before a policy
scores a pool, the pool is narrowed to

    holders    workers holding the adapter (in their last report, or routed a request
               under it since: its load is on the way)
    + room     workers with a free slot, too, when no holder is within SPREAD_TOKENS of
               the lightest of them (a hot adapter spreads instead of queuing on one worker)
    = all      when that leaves none (each would evict one)

and the policy then weighs prefix hits and load within it as for any request (an adapter's
KV hashes are its own: core/lora.py, so hits are within the adapter too).
"""

from __future__ import annotations

from router.routing.pool import Pool, prefill_load

SPREAD_TOKENS = 4096
"""Queued prefill tokens a holder may carry beyond the lightest free-slot worker before the
adapter spreads to that worker."""


def adapter_pool(pool: Pool, adapter: str | None) -> Pool:
    """`pool` narrowed for a request under `adapter` (None: the base model, all of it)."""
    if adapter is None or not pool.workers:
        return pool
    holders = [w for w in pool.workers if adapter in w.adapters]
    room = [w for w in pool.workers if adapter not in w.adapters and w.has_adapter_room]
    if holders and room:
        lightest_holder = min(prefill_load(w) for w in holders)
        if lightest_holder - min(prefill_load(w) for w in room) <= SPREAD_TOKENS:
            room = []
    kept = holders + room
    if not kept or len(kept) == len(pool.workers):
        return pool
    return Pool(kept)
