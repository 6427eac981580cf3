"""The prefill admission queue: token-weighted, first in first out unless a waiter behind the
head has a longer prefix in the worker's cache (within a bound), every wait bounded; the slot
belongs to the request's ticket and is freed exactly once."""

import asyncio

import pytest

from core.errors import WorkerFailedError
from core.events import BlockStored, KVEventBatch
from core.fair_share import FairShare, FairShareConfig
from router.cluster.prefill_gate import PrefillGate, next_in_line
from router.routing.route import Router, RouterConfig
from router.routing.ticket import Ticket


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def make_gate(cap: int) -> PrefillGate:
    """A gate over a router with prefill worker p0 (model m0) and p1 (model m1)."""
    router = Router(RouterConfig(disagg_min_uncached_tokens=0))
    for i in (0, 1):
        router.add_worker(f"p{i}", "prefill", f"m{i}")
        router.add_worker(f"d{i}", "decode", f"m{i}")
    return PrefillGate(router, cap)


def ticket(gate: PrefillGate, rid: str, tokens: int, worker: str = "p0") -> Ticket:
    model = "m" + worker[1:]
    t = gate.router.route(model, block_hashes=[], num_prompt_tokens=tokens, request_id=rid)
    assert (t.decision.prefill_worker_id, t.prefill_tokens) == (worker, tokens)
    return t


def admitted(gate: PrefillGate, worker: str = "p0") -> int:
    return gate.router.admitted_tokens(worker)


def test_admits_under_the_cap_and_queues_beyond_it():
    async def main():
        gate = make_gate(100)
        a, b, c = ticket(gate, "a", 60), ticket(gate, "b", 40), ticket(gate, "c", 10)
        await gate.admit(a, 1)
        await gate.admit(b, 1)
        assert admitted(gate) == 100
        waiting = asyncio.create_task(gate.admit(c, 5))
        await asyncio.sleep(0.01)
        assert not waiting.done() and gate.num_waiting("p0") == 1
        await gate.admit(ticket(gate, "x", 100, "p1"), 1)  # other workers: their own queue
        a.prefill_done()
        await waiting
        assert admitted(gate) == 50 and gate.num_waiting() == 0

    run(main())


def test_a_prompt_longer_than_the_cap_runs_alone():
    async def main():
        gate = make_gate(100)
        long = ticket(gate, "long", 5000)
        await gate.admit(long, 1)
        small = asyncio.create_task(gate.admit(ticket(gate, "small", 1), 5))
        await asyncio.sleep(0.01)
        assert not small.done()
        long.prefill_done()
        await small
        await asyncio.wait_for(gate.admit(ticket(gate, "next", 99), 1), 1)

    run(main())


def test_first_in_first_out_short_prompts_do_not_overtake():
    async def main():
        gate = make_gate(100)
        a = ticket(gate, "a", 90)
        await gate.admit(a, 1)
        order: list[str] = []

        async def want(rid: str, tokens: int) -> None:
            await gate.admit(ticket(gate, rid, tokens), 5)
            order.append(rid)

        big = asyncio.create_task(want("big", 80))
        await asyncio.sleep(0.01)
        tiny = asyncio.create_task(want("tiny", 5))  # would fit now, but waits its turn
        await asyncio.sleep(0.01)
        assert order == []
        a.close()
        await asyncio.gather(big, tiny)
        assert order == ["big", "tiny"]

    run(main())


def test_timeout_leaves_the_queue_and_lets_the_next_in():
    async def main():
        gate = make_gate(100)
        await gate.admit(ticket(gate, "a", 50), 1)
        huge = ticket(gate, "huge", 100)
        with pytest.raises(TimeoutError):
            await gate.admit(huge, 0.05)
        huge.close()
        assert gate.num_waiting("p0") == 0
        await asyncio.wait_for(gate.admit(ticket(gate, "b", 50), 1), 1)

    run(main())


def test_cancelled_waiter_is_forgotten():
    async def main():
        gate = make_gate(10)
        a, b = ticket(gate, "a", 10), ticket(gate, "b", 10)
        await gate.admit(a, 1)
        t = asyncio.create_task(gate.admit(b, 5))
        await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        b.close()
        a.close()
        assert admitted(gate) == 0 and gate.num_waiting() == 0

    run(main())


def test_the_slot_is_freed_exactly_once():
    async def main():
        gate = make_gate(10)
        a = ticket(gate, "a", 5)
        await gate.admit(a, 1)
        other = ticket(gate, "o", 4)
        await gate.admit(other, 1)
        a.prefill_done()
        a.prefill_done()
        a.close()
        a.close()
        assert admitted(gate) == 4  # the other request's slot is untouched
        other.close()
        assert admitted(gate) == 0 and gate.router.num_in_flight == 0

    run(main())


def test_a_worker_leaving_fails_its_waiters_at_once():
    async def main():
        gate = make_gate(10)
        await gate.admit(ticket(gate, "a", 10), 1)
        t = asyncio.create_task(gate.admit(ticket(gate, "b", 10), 30))
        await asyncio.sleep(0.01)
        gate.drop_worker("p0")
        with pytest.raises(WorkerFailedError, match="left the cluster"):
            await t

    run(main())


def test_cap_must_be_positive():
    with pytest.raises(ValueError, match="max_tokens"):
        PrefillGate(Router(), 0)


def test_late_binding_routes_a_request_only_when_a_worker_has_room():
    async def main():
        gate = make_gate(100)
        routed: list[str] = []

        def route(rid: str, tokens: int):
            def go() -> Ticket:
                routed.append(rid)
                return ticket(gate, rid, tokens)

            return go

        a = await gate.bind("m0", route("a", 60), 1)  # room: routed at once
        await gate.admit(a, 1)
        b = await gate.bind("m0", route("b", 50), 1)  # 60 admitted < 100: still room
        b_admit = asyncio.create_task(gate.admit(b, 5))  # 60 + 50 > 100: waits at p0's gate
        await asyncio.sleep(0.01)
        c = asyncio.create_task(gate.bind("m0", route("c", 10), 5))
        d = asyncio.create_task(gate.bind("m0", route("d", 10), 5))
        await asyncio.sleep(0.01)
        assert routed == ["a", "b"] and gate.num_waiting() == 3  # b at p0, c and d unrouted
        a.prefill_done()  # b is admitted, then c and d are routed, in order, into the room
        await b_admit
        tc, td = await c, await d
        assert routed == ["a", "b", "c", "d"]
        assert (tc.decision.request_id, td.decision.request_id) == ("c", "d")
        for t in (b, tc, td):
            t.close()
        assert admitted(gate) == 0 and gate.num_waiting() == 0

    run(main())


def test_an_unrouted_request_that_times_out_is_never_routed():
    async def main():
        gate = make_gate(10)
        big = ticket(gate, "big", 100)
        await gate.admit(big, 1)  # runs alone, over the cap: no room
        routed: list[str] = []
        with pytest.raises(TimeoutError):
            await gate.bind("m0", lambda: routed.append("x") or ticket(gate, "x", 5), 0.3)
        big.close()
        await asyncio.sleep(0.01)
        assert routed == [] and gate.num_waiting() == 0

    run(main())


def test_late_binding_with_no_prefill_pool_routes_at_once():
    async def main():
        router = Router(RouterConfig())
        router.add_worker("d0", "decode", "m")
        gate = PrefillGate(router, 10)
        t = await gate.bind("m", lambda: router.route("m", block_hashes=[1], request_id="q"), 1)
        assert t.decision.prefill_on_decode
        t.close()

    run(main())


# -- who goes next: the longest cached prefix, within a bound --------------------------------


def cached_gate(cap: int, max_skips: int = 16) -> PrefillGate:
    """A gate over a router whose prefill worker p0 (model m0) caches the chain 11, 12, 13."""
    router = Router(RouterConfig(disagg_min_uncached_tokens=0, gate_max_skips=max_skips))
    router.add_worker("p0", "prefill", "m0")
    router.add_worker("d0", "decode", "m0")
    router.apply(KVEventBatch("p0", 0, [BlockStored(None, [11, 12, 13])], model="m0"))
    return PrefillGate(router, cap)


async def queue_up(gate: PrefillGate, prompts: dict[str, list[int]]) -> tuple[list, list[str]]:
    """Each prompt (its chain of 16-token blocks) routed and waiting at p0's gate, in order;
    returns the tasks and the list their admissions append to."""
    order: list[str] = []

    async def want(rid: str, chain: list[int]) -> None:
        t = gate.router.route("m0", block_hashes=chain, num_prompt_tokens=16 * len(chain))
        await gate.admit(t, 5, chain)
        order.append(rid)

    tasks = []
    for rid, chain in prompts.items():
        tasks.append(asyncio.create_task(want(rid, chain)))
        await asyncio.sleep(0.01)
    return tasks, order


def test_next_in_line_passes_the_head_only_for_a_longer_cached_prefix():
    assert next_in_line([0, 3, 1], [True, True, True], 0, 16) == 1
    assert next_in_line([0, 3, 3], [True, True, True], 0, 16) == 1  # the earliest of equals
    assert next_in_line([2, 2, 1], [True, True, True], 0, 16) == 0  # no longer: the head
    assert next_in_line([0, 3, 5], [True, True, False], 0, 16) == 1  # 5 does not fit now
    assert next_in_line([0, 0], [False, True], 0, 16) is None  # equal: it waits behind
    assert next_in_line([0, 4], [False, True], 0, 16) == 1
    assert next_in_line([0, 4], [True, True], 16, 16) == 0  # passed over enough
    assert next_in_line([0, 4], [False, True], 16, 16) is None
    assert next_in_line([0, 4], [True, True], 0, 0) == 0  # 0: first in, first out


def admission_order(max_skips: int, prompts: dict[str, list[int]]) -> list[str]:
    """The order in which the prompts, queued in this order behind a 90-token prefill at a
    100-token gate, are admitted once it ends."""

    async def main() -> list[str]:
        gate = cached_gate(100, max_skips)
        first = ticket(gate, "first", 90, "p0")
        await gate.admit(first, 1)
        tasks, order = await queue_up(gate, prompts)
        assert order == [] and gate.num_waiting("p0") == len(prompts)
        first.close()
        await asyncio.gather(*tasks)
        return order

    return run(main())


def test_the_worker_s_cached_prefix_goes_first():
    prompts = {"cold": [21, 22], "warm": [11, 12, 13, 14], "lukewarm": [11, 31]}
    assert admission_order(16, prompts) == ["warm", "lukewarm", "cold"]


def test_a_waiter_passed_over_max_skips_times_goes_next():
    prompts = {"cold": [21, 22], "warm": [11, 12, 13, 14], "warm2": [11, 12, 13, 15]}
    assert admission_order(1, prompts) == ["warm", "cold", "warm2"]


def test_max_skips_0_is_first_in_first_out():
    prompts = {"cold": [21, 22], "warm": [11, 12, 13, 14]}
    assert admission_order(0, prompts) == ["cold", "warm"]


def test_a_longer_cached_prefix_that_fits_passes_a_head_that_does_not():
    async def main():
        gate = cached_gate(100)
        a, b = ticket(gate, "a", 50, "p0"), ticket(gate, "b", 40, "p0")
        await gate.admit(a, 1)
        await gate.admit(b, 1)
        # cold: 80 uncached tokens; warm: 4 blocks, 3 cached: 16 to compute
        tasks, order = await queue_up(
            gate, {"cold": [21, 22, 23, 24, 25], "warm": [11, 12, 13, 14]}
        )
        b.close()  # 50 admitted: cold (80) does not fit, warm (16) does
        await asyncio.sleep(0.01)
        assert order == ["warm"]
        a.close()
        await asyncio.gather(*tasks)
        assert order == ["warm", "cold"]

    run(main())


def class_order(gate: PrefillGate, waiters: list[tuple[str, int, str]]) -> list[str]:
    """Fill p0's slot with one request, queue `waiters` ((id, priority, tenant), 10 tokens
    each), then free the slot one admission at a time: the order they were admitted in."""

    async def main() -> list[str]:
        holder = ticket(gate, "holder", 100)
        await gate.admit(holder, 1)
        order: list[str] = []
        tickets = {rid: ticket(gate, rid, 100) for rid, _, _ in waiters}

        async def wait(rid: str, priority: int, tenant: str) -> None:
            await gate.admit(tickets[rid], 5, priority=priority, tenant=tenant)
            order.append(rid)

        tasks = []
        for w in waiters:
            tasks.append(asyncio.create_task(wait(*w)))
            await asyncio.sleep(0)  # queued in this order
        holder.prefill_done()
        for _ in waiters:
            await asyncio.sleep(0.01)
            tickets[order[-1]].prefill_done()
        await asyncio.gather(*tasks)
        return order

    return run(main())


def test_the_best_priority_is_admitted_first_then_first_in():
    gate = make_gate(100)
    waiters = [("a", 1, ""), ("b", 0, ""), ("c", 1, ""), ("d", -2, "")]
    assert class_order(gate, waiters) == ["d", "b", "a", "c"]


def test_tenants_take_turns_by_what_they_were_served():
    gate = make_gate(100)
    waiters = [(f"flood{i}", 0, "flood") for i in range(4)] + [("quiet0", 0, "quiet")]
    order = class_order(gate, waiters)
    # flood0 is served first (the quiet one had not arrived); then quiet0 has the least.
    assert order[:2] == ["flood0", "quiet0"], order
    assert gate.fair.served("flood") == 400 and gate.fair.served("quiet") == 100


def test_without_fair_share_tenants_queue_first_in_first_out():
    gate = make_gate(100)
    gate.fair = FairShare(FairShareConfig(enabled=False))
    waiters = [(f"flood{i}", 0, "flood") for i in range(4)] + [("quiet0", 0, "quiet")]
    assert class_order(gate, waiters) == [*(f"flood{i}" for i in range(4)), "quiet0"]
