"""Every await on another actor has a deadline: a wedged controller or worker turns into a
clear error naming the call, never a request, a scrape or an admin call that hangs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from core.errors import DeadlineExceededError

T = TypeVar("T")

CONTROL_CALL_S = 10.0
"""A control-plane question (members, pool sizes, scale, connect): answered at once when
the actor is alive."""
DRAIN_CALL_S = 120.0
"""A drain: the controller waits up to 90 s for the worker's running requests."""


async def bounded(call: Awaitable[T], timeout_s: float, what: str) -> T:
    try:
        return await asyncio.wait_for(call, timeout_s)
    except TimeoutError as e:
        raise DeadlineExceededError(f"{what} did not answer within {timeout_s:g} s") from e
