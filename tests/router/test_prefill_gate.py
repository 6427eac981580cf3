"""The prefill admission queue: token-weighted, first in first out, every wait bounded."""

import asyncio

import pytest

from core.errors import WorkerFailedError
from router.cluster.prefill_gate import PrefillGate


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_admits_under_the_cap_and_queues_beyond_it():
    async def main():
        gate = PrefillGate(100)
        await gate.acquire("p0", "a", 60, 1)
        await gate.acquire("p0", "b", 40, 1)
        assert gate.in_flight_tokens("p0") == 100
        c = asyncio.create_task(gate.acquire("p0", "c", 10, 5))
        await asyncio.sleep(0.01)
        assert not c.done() and gate.num_waiting("p0") == 1
        await gate.acquire("p1", "x", 100, 1)  # other workers have their own queue
        gate.release("p0", "a")
        await c
        assert gate.in_flight_tokens("p0") == 50 and gate.num_waiting() == 0

    run(main())


def test_a_prompt_longer_than_the_cap_runs_alone():
    async def main():
        gate = PrefillGate(100)
        await gate.acquire("p", "long", 5000, 1)
        small = asyncio.create_task(gate.acquire("p", "small", 1, 5))
        await asyncio.sleep(0.01)
        assert not small.done()
        gate.release("p", "long")
        await small
        await asyncio.wait_for(gate.acquire("p", "next", 99, 1), 1)

    run(main())


def test_first_in_first_out_short_prompts_do_not_overtake():
    async def main():
        gate = PrefillGate(100)
        await gate.acquire("p", "a", 90, 1)
        order: list[str] = []

        async def want(rid: str, tokens: int) -> None:
            await gate.acquire("p", rid, tokens, 5)
            order.append(rid)

        big = asyncio.create_task(want("big", 80))
        await asyncio.sleep(0.01)
        tiny = asyncio.create_task(want("tiny", 5))  # would fit now, but waits its turn
        await asyncio.sleep(0.01)
        assert order == []
        gate.release("p", "a")
        await asyncio.gather(big, tiny)
        assert order == ["big", "tiny"]

    run(main())


def test_timeout_leaves_the_queue_and_lets_the_next_in():
    async def main():
        gate = PrefillGate(100)
        await gate.acquire("p", "a", 50, 1)
        with pytest.raises(TimeoutError):
            await gate.acquire("p", "huge", 100, 0.05)
        assert gate.num_waiting("p") == 0
        await asyncio.wait_for(gate.acquire("p", "b", 50, 1), 1)

    run(main())


def test_cancelled_waiter_is_forgotten():
    async def main():
        gate = PrefillGate(10)
        await gate.acquire("p", "a", 10, 1)
        t = asyncio.create_task(gate.acquire("p", "b", 10, 5))
        await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        gate.release("p", "a")
        assert gate.in_flight_tokens("p") == 0 and gate.num_waiting() == 0

    run(main())


def test_release_is_idempotent_and_unknown_ids_are_ignored():
    async def main():
        gate = PrefillGate(10)
        await gate.acquire("p", "a", 5, 1)
        gate.release("p", "a")
        gate.release("p", "a")
        gate.release("p", "never")
        gate.release("nobody", "a")
        assert gate.in_flight_tokens("p") == 0

    run(main())


def test_a_worker_leaving_fails_its_waiters_at_once():
    async def main():
        gate = PrefillGate(10)
        await gate.acquire("p", "a", 10, 1)
        t = asyncio.create_task(gate.acquire("p", "b", 10, 30))
        await asyncio.sleep(0.01)
        gate.drop_worker("p")
        with pytest.raises(WorkerFailedError, match="left the cluster"):
            await t

    run(main())


def test_cap_must_be_positive():
    with pytest.raises(ValueError, match="max_tokens"):
        PrefillGate(0)
