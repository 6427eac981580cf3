"""A control-plane call that never answers ends in a clear error naming the call."""

from __future__ import annotations

import asyncio

import pytest

from core.errors import DeadlineExceededError
from router.cluster.deadlines import bounded


def test_a_call_that_never_answers_fails_with_its_name() -> None:
    async def main() -> None:
        never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        with pytest.raises(DeadlineExceededError, match=r"the controller \(members\) did not"):
            await bounded(never, 0.05, "the controller (members)")
        assert await bounded(asyncio.sleep(0, result=7), 1.0, "x") == 7

    asyncio.run(main())
