"""The ttft policy's picker: the smallest key among the candidates wins.

    key_w = (tier_w, cost_w, P_w, rotation_w)                   tiers FITS, OVER_MEASURED
    key_w = (NO_ROOM, over_measured_w, P_w + work_w, rotation_w)   no room for the request

    rotation_w = (position_w - start) mod n, start = the decision count mod n

So the cheapest candidate within the bounds wins (ties: the smaller tally, then pool order
from a rotating start); where the request takes every candidate over the bound, the least
loaded after it (those within the measured bound first). The runner-up is the cheapest other
candidate of the winner's tier (the debug log's measure of how close the call was).
"""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.policies.ttft.bounded_load import NO_ROOM, LoadBound
from router.routing.policies.ttft.cost import Estimate


def pick(
    candidates: Sequence[int],
    estimates: Sequence[Estimate],
    tiers: Sequence[int],
    bound: LoadBound,
    start: int,
) -> tuple[int, float]:
    """(index in `candidates` of the winner, runner-up cost)."""
    n, tallies = len(bound.tallies), bound.tallies
    best_k, best_key = 0, None
    for k, (j, est, tier) in enumerate(zip(candidates, estimates, tiers, strict=True)):
        if tier == NO_ROOM:
            key = (NO_ROOM, bound.over_measured[j] + 0.0, tallies[j] + est.work, (j - start) % n)
        else:
            key = (tier, est.cost, tallies[j], (j - start) % n)
        if best_key is None or key < best_key:
            best_k, best_key = k, key
    runner_up = float("inf")
    for k, (est, tier) in enumerate(zip(estimates, tiers, strict=True)):
        if tier == tiers[best_k] and k != best_k:
            runner_up = min(runner_up, est.cost)
    return best_k, runner_up
