"""A worker's output channels, one per front door: each request's deltas reach its front door
in one batch per engine step over one long-lived Ray stream (`DecodeWorker.outputs`).

The front door opens its channel once per worker and names it in every `generate` / `admit`
call. Deadlines stay the worker's job, as with a stream per request: a request that passes
its deadline gets a DeadlineExceededError in the channel and is aborted here, so a front
door that went away without a word cannot leave requests running. When the channel's stream
ends (its front door is gone or cancelled it), every request still open on it is aborted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from core.errors import DeadlineExceededError
from engine.output_channel import Item, OutputChannel, is_final

_IDLE_WAIT_S = 1.0
"""How long the stream waits for output when no request has a deadline: bounds every wait."""


class Outlet:
    def __init__(self, channel_id: str) -> None:
        self.channel_id = channel_id
        self.channel = OutputChannel(asyncio.get_running_loop())
        self._deadlines: dict[str, float] = {}
        """Open request id -> loop time by which it must finish."""
        self.cursor = -1
        """The seq of the last KV-event batch this channel's reports carried."""

    def forget(self, request_id: str) -> None:
        self._deadlines.pop(request_id, None)

    def watch(self, request_id: str, timeout_s: float) -> None:
        self._deadlines[request_id] = self.channel.loop.time() + timeout_s

    @property
    def open_requests(self) -> list[str]:
        return list(self._deadlines)

    async def next_batch(self, abort: Callable[[str], None]) -> list[Item]:
        """The next step's items; also an error item for each request past its deadline
        (which `abort` cancels)."""
        loop = self.channel.loop
        wait = _IDLE_WAIT_S
        if self._deadlines:
            wait = min(wait, max(0.0, min(self._deadlines.values()) - loop.time()))
        batch = await self.channel.next_batch(wait)
        for request_id, item in batch:
            if is_final(item):
                self._deadlines.pop(request_id, None)
        now = loop.time()
        for request_id, deadline in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[request_id]
                abort(request_id)
                batch.append(
                    (request_id, DeadlineExceededError(f"request {request_id} passed its deadline"))
                )
        return batch


class Outlets:
    """The channels of one worker, by id. A call may name a channel before its stream has
    started (both are in flight from the same front door): either one creates it."""

    def __init__(self) -> None:
        self._by_id: dict[str, Outlet] = {}

    def get(self, channel_id: str) -> Outlet:
        outlet = self._by_id.get(channel_id)
        if outlet is None:
            outlet = self._by_id[channel_id] = Outlet(channel_id)
        return outlet

    def drop(self, channel_id: str) -> Outlet | None:
        return self._by_id.pop(channel_id, None)

    def forget(self, request_id: str) -> None:
        """An aborted request: no deadline to watch any more."""
        for outlet in self._by_id.values():
            outlet.forget(request_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def wake_all(self) -> None:
        """Every stream's wait for output ends now (an empty batch)."""
        for outlet in self._by_id.values():
            outlet.channel.deliver([])
