"""Requests waiting for a decode worker's KV blocks, served in the fair share's order.

A disaggregated request reserves its blocks on its decode worker before its prefill starts
(router/cluster/attempt.py). While that worker's cache is full the reservation is refused
and the request waits for its running requests to free blocks. Without order, every waiter
retries on its own clock, and whichever asks first after blocks free wins: a flood's many
waiters win most of the time. So the waiters of one decode worker form a line: only the one
whose turn it is retries, the turn following the same classes as the prefill gate and the
engines' queues (core/fair_share.py: the best priority, then the tenant served least, then
first in). When it gets its blocks, or gives up, the next turn's waiter is woken.

A request whose worker has no line reserves at once (the common case: nothing to order).
Runs on the front door's event loop only.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from core.fair_share import FairShare


@dataclass(eq=False)
class Waiting:
    worker_id: str
    priority: int
    tenant: str
    order: int
    turn: asyncio.Event = field(default_factory=asyncio.Event)


class DecodeLine:
    def __init__(self, fair: FairShare | None = None) -> None:
        self.fair = fair or FairShare()
        self._lines: dict[str, list[Waiting]] = {}
        self._order = itertools.count()

    def busy(self, worker_id: str) -> bool:
        """Whether requests already wait for this worker's blocks."""
        return bool(self._lines.get(worker_id))

    def join(self, worker_id: str, priority: int, tenant: str) -> Waiting:
        line = self._lines.setdefault(worker_id, [])
        if self.fair.config.enabled:
            self.fair.rejoin(tenant, [w.tenant for w in line])
        waiting = Waiting(worker_id, priority, tenant, next(self._order))
        line.append(waiting)
        self._wake(worker_id)
        return waiting

    def has_turn(self, waiting: Waiting) -> bool:
        return self._next(waiting.worker_id) is waiting

    async def wait_turn(self, waiting: Waiting, timeout_s: float) -> None:
        """Until it is `waiting`'s turn; TimeoutError after `timeout_s`."""
        while not self.has_turn(waiting):
            waiting.turn.clear()
            # The turn moves as tenants are served (their counts change with no one
            # joining or leaving): whoever has it now is woken, as this one stands aside.
            self._wake(waiting.worker_id)
            await asyncio.wait_for(waiting.turn.wait(), timeout_s)

    def leave(self, waiting: Waiting) -> None:
        """It got its blocks or gave up: the next turn's waiter is woken."""
        line = self._lines.get(waiting.worker_id)
        if line is None or waiting not in line:
            return
        line.remove(waiting)
        if not line:
            del self._lines[waiting.worker_id]
        else:
            self._wake(waiting.worker_id)

    def _next(self, worker_id: str) -> Waiting | None:
        line = self._lines.get(worker_id)
        if not line:
            return None
        best = self.fair.next_class({self.fair.class_of(w.priority, w.tenant) for w in line})
        return min(
            (w for w in line if self.fair.class_of(w.priority, w.tenant) == best),
            key=lambda w: w.order,
        )

    def _wake(self, worker_id: str) -> None:
        head = self._next(worker_id)
        if head is not None:
            head.turn.set()
