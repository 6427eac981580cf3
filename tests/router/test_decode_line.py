"""The line of requests waiting for a decode worker's KV blocks (router/cluster/decode_line.py):
turns go by priority, then the tenant served least, then first in; leaving wakes the next
turn; a wait ends at its timeout; lines of different workers are apart."""

from __future__ import annotations

import asyncio

import pytest

from core.fair_share import FairShare, FairShareConfig
from router.cluster.decode_line import DecodeLine


def test_turns_go_by_priority_then_the_tenant_served_least() -> None:
    async def run() -> list[str]:
        fair = FairShare(FairShareConfig())
        line = DecodeLine(fair)
        fair.charge("flood", prompt_tokens=5000)
        floods = [line.join("d0", 0, "flood") for _ in range(3)]
        quiet = line.join("d0", 0, "quiet")  # back from idle: at the flood's count (VTC)
        fair.charge("flood", output_tokens=100)  # the flood's streams go on meanwhile
        urgent = line.join("d0", -1, "flood")
        assert line.join("d1", 0, "flood") is not None  # another worker's line is apart
        served = []
        for _ in range(5):
            head = next(w for w in [*floods, quiet, urgent] if line.has_turn(w))
            await line.wait_turn(head, 1.0)
            served.append(f"{head.tenant}{head.priority}")
            line.leave(head)
        return served

    assert asyncio.run(run()) == ["flood-1", "quiet0", "flood0", "flood0", "flood0"]


def test_without_fair_share_a_priority_is_first_in_first_out() -> None:
    line = DecodeLine(FairShare(FairShareConfig(enabled=False)))
    fair_first = [line.join("d0", 0, t) for t in ("b", "a", "c")]
    assert [line.has_turn(w) for w in fair_first] == [True, False, False]


def test_leaving_wakes_the_next_turn_and_waits_time_out() -> None:
    async def run() -> None:
        line = DecodeLine()
        first, second = line.join("d0", 0, ""), line.join("d0", 0, "")
        waiter = asyncio.create_task(line.wait_turn(second, 5.0))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        line.leave(first)
        await asyncio.wait_for(waiter, 1.0)
        third = line.join("d0", 0, "")
        with pytest.raises(TimeoutError):
            await line.wait_turn(third, 0.05)
        line.leave(second)
        line.leave(third)
        assert not line.busy("d0")

    asyncio.run(run())


def test_a_turn_moved_by_charges_is_handed_on() -> None:
    async def run() -> None:
        fair = FairShare(FairShareConfig())
        line = DecodeLine(fair)
        a, b = line.join("d0", 0, "a"), line.join("d0", 0, "b")
        waiter = asyncio.create_task(line.wait_turn(b, 5.0))
        await asyncio.sleep(0.01)
        fair.charge("a", output_tokens=50)  # a is streaming: b is served least now
        stands_aside = asyncio.create_task(line.wait_turn(a, 5.0))
        await asyncio.wait_for(waiter, 1.0)  # b was woken, not left to its timeout
        line.leave(b)
        await asyncio.wait_for(stands_aside, 1.0)

    asyncio.run(run())
