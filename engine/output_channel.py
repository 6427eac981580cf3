"""Many requests' outputs to one asyncio consumer, one batch per engine step.

A worker serves the requests of a few front doors. Handing each output to a stream of its own
costs an event-loop wake-up and a Ray message per token per request: in a unified worker at
2 req/s on two cores, those threads take ~18% of a core from the engine's compute threads. A
channel collects one step's outputs for every request of one consumer and hands them over as
one list: one wake-up and one message per step, however many requests are running.
"""

from __future__ import annotations

import asyncio

from core.request import OutputDelta

Item = tuple[str, OutputDelta | BaseException]
"""(request id, its next delta or the error that ends it)."""


def is_final(item: OutputDelta | BaseException) -> bool:
    return isinstance(item, BaseException) or item.finished


class OutputChannel:
    """The consumer side; `deliver` runs on the consumer's loop (the engine thread schedules
    it there with `call_soon_threadsafe`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: list[Item] = []
        self._ready = asyncio.Event()

    def deliver(self, items: list[Item]) -> None:
        self._pending.extend(items)
        self._ready.set()

    async def next_batch(self, timeout_s: float | None) -> list[Item]:
        """Everything delivered since the last call; [] if nothing came within `timeout_s`."""
        if not self._pending:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout_s)
            except TimeoutError:
                return []
        self._ready.clear()
        batch, self._pending = self._pending, []
        return batch
