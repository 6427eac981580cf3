"""A prefix hit in an offload tier is credited by what it saves (router.routing.restore_cost):
prefill time, less the copy back at the worker's measured speed, or its tier's prior
bandwidth until it has measured one."""

from __future__ import annotations

import pytest

from core.events import BlockStored, BlockTiered, KVEventBatch, WorkerLoad
from core.step_stats import StepTotals
from router.routing.restore_cost import RestoreCost
from router.routing.route import Router, RouterConfig
from router.routing.worker_state import WorkerState

B = 16
HASHES = list(range(1, 41))  # a 40-block prompt
KV_BYTES_PER_TOKEN = 1e6  # a block: 16 MB, 1.6 ms from host and 8 ms from disk (priors)


def router_with(policy: str) -> Router:
    router = Router(RouterConfig(prefill_policy=policy, disagg_min_uncached_tokens=0))
    for w in ("p0", "p1"):
        router.add_worker(w, "prefill", "m")
    router.add_worker("d0", "decode", "m")
    router.set_kv_bytes_per_token(KV_BYTES_PER_TOKEN)
    return router


def holds(router: Router, worker: str, seq: int, *events) -> None:
    router.apply(KVEventBatch(worker, seq, list(events), model="m"))


def restores(router: Router, worker: str, disk_s_per_block: float) -> None:
    """Two load reports whose totals say the worker copies a block back from disk in
    `disk_s_per_block` (and from host in a tenth of that)."""
    for at, n in ((1.0, 10), (2.0, 20)):
        seconds = [n * disk_s_per_block / 10, n * disk_s_per_block]
        steps = StepTotals(tier_restored_blocks=[n, n], tier_restore_s=seconds)
        router.report_load(WorkerLoad(worker, "prefill", 0, 0, 0, 100, 100, at, steps=steps))


def route(router: Router) -> tuple[str | None, dict[str, float]]:
    ticket = router.route("m", block_hashes=HASHES, num_prompt_tokens=len(HASHES) * B)
    ticket.close()
    return ticket.decision.prefill_worker_id, dict(ticket.decision.terms)


def first_route(policy: str, p0: list, p1: list, disk_s_per_block: float = 0.0):
    """Where a fresh router sends the prompt when p0 and p1 hold what these events say (a
    fresh one each time: the ttft policy's bounded load remembers where it sent the last)."""
    router = router_with(policy)
    holds(router, "p0", 0, *p0)
    holds(router, "p1", 0, *p1)
    if disk_s_per_block:
        restores(router, "p1", disk_s_per_block)
    return route(router)


@pytest.mark.parametrize("policy", ["cache_aware", "ttft"])
def test_a_hit_in_a_tier_costs_its_copy_back(policy: str) -> None:
    on_device = [BlockStored(None, HASHES)]
    part_on_disk = [BlockStored(None, HASHES), BlockTiered(HASHES[10:], 2)]
    # Same hit, same load: the one on the device wins (a tie would go to p1 by rotation).
    assert first_route(policy, on_device, part_on_disk)[0] == "p0"
    chosen, terms = first_route(policy, part_on_disk, on_device)
    assert chosen == "p1"
    restore_term = "prefill_restore_s" if policy == "ttft" else "prefill_restore_tokens"
    assert terms[restore_term] == 0.0


@pytest.mark.parametrize("policy", ["cache_aware", "ttft"])
def test_a_tier_hit_beats_computing_unless_the_tier_is_slower_than_computing(
    policy: str,
) -> None:
    in_host = [BlockStored(None, HASHES), BlockTiered(HASHES, 1)]
    chosen, terms = first_route(policy, [], in_host)
    assert chosen == "p1"  # 40 copies of 1.6 ms beat 640 tokens at the 2 ms/token prior
    restore = terms["prefill_restore_s"] if policy == "ttft" else terms["prefill_restore_tokens"]
    expected_s = 40 * B * KV_BYTES_PER_TOKEN / 10e9
    assert restore == pytest.approx(expected_s if policy == "ttft" else expected_s / 2e-3)
    on_disk = [BlockStored(None, HASHES), BlockTiered(HASHES, 2)]
    assert first_route(policy, [], on_disk)[0] == "p1"  # 8 ms a block: still cheaper
    # Measured: a slow disk, 0.1 s a block. Computing 640 tokens beats 4 s of copies.
    assert first_route(policy, [], on_disk, disk_s_per_block=0.1)[0] == "p0"


def test_the_cost_uses_the_measured_rate_then_the_prior() -> None:
    cost = RestoreCost(tier_gbps=(10.0, 2.0))
    cost.set_kv_bytes_per_token(1000.0)
    worker = WorkerState("p", "prefill", "m")
    assert cost.seconds(worker, [3, 1], B) == pytest.approx(3 * 16e3 / 10e9 + 16e3 / 2e9)
    worker.step_rate.restore_s_per_block = [0.5, 0.0]  # host measured, disk not yet
    assert cost.seconds(worker, [3, 1], B) == pytest.approx(1.5 + 16e3 / 2e9)
    assert cost.for_pool([worker], {"q": [1, 1]}, B) == {}
    with pytest.raises(ValueError, match="must be > 0"):
        RestoreCost(tier_gbps=(10.0, 0.0))
