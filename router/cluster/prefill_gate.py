"""Prefill admission: how much prompt work may be in flight at one prefill worker.

In disaggregated serving the decode worker reserves a prompt's KV blocks *before* the
prefill worker computes it (the prefill writes straight into them). A request queued
behind a long prefill backlog would hold those decode blocks idle for the whole wait: under
a burst the decode pool fills with reservations nobody is computing yet, and new requests
are refused although the decode worker is mostly idle. So the front door keeps a FIFO queue
per prefill worker, and a request reserves decode blocks and starts its prefill only while
that worker's admitted uncached prompt tokens stay under a cap. A couple of engine steps'
worth keeps the prefill worker busy without holding decode blocks longer than needed.

The gate keeps no count of its own: admitted tokens are the router's ledger
(`Router.admitted_tokens`), and a request's `Ticket` holds its slot; when the ticket frees it
(prefill done, or closed) the ticket calls back here and whoever now fits is admitted.

A request is always admitted when nothing is in flight, however long its prompt. Written
here rather than with `asyncio.Semaphore` because admission is weighted by tokens and must
stay first-in, first-out (a semaphore would let short prompts overtake a long one forever).
Runs on the front door's event loop only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from core.errors import WorkerFailedError
from router.routing.router import Router
from router.routing.ticket import Ticket


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    future: asyncio.Future[None]


class PrefillGate:
    def __init__(self, router: Router, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.router = router
        self.max_tokens = max_tokens
        self._queues: dict[str, deque[_Waiter]] = {}

    async def admit(self, ticket: Ticket, timeout_s: float) -> None:
        """Wait (first in, first out) until the ticket's prefill worker may take its tokens,
        then admit the ticket. Raises TimeoutError after `timeout_s`, WorkerFailedError if
        the worker leaves meanwhile. The ticket frees the slot; nothing to release here."""
        worker_id = ticket.decision.prefill_worker_id
        if worker_id is None:
            raise ValueError("a request prefilled by its decode worker passes no gate")
        queue = self._queues.setdefault(worker_id, deque())
        if not queue and self._fits(worker_id, ticket):
            self._admit(worker_id, ticket)
            return
        waiter = _Waiter(ticket, asyncio.get_running_loop().create_future())
        queue.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
        except BaseException:
            if not waiter.future.done():
                waiter.future.cancel()
                if waiter in queue:
                    queue.remove(waiter)
                self._wake(worker_id)  # a long head leaving may let the next ones in
            # else: admitted as we gave up; closing the ticket frees the slot again
            raise

    def _fits(self, worker_id: str, ticket: Ticket) -> bool:
        admitted = self.router.admitted_tokens(worker_id)
        return not admitted or admitted + max(1, ticket.prefill_tokens) <= self.max_tokens

    def _admit(self, worker_id: str, ticket: Ticket) -> None:
        ticket.admit(on_release=lambda: self._wake(worker_id))

    def _wake(self, worker_id: str) -> None:
        """Admit, in order, whoever now fits."""
        queue = self._queues.get(worker_id)
        while queue and self._fits(worker_id, queue[0].ticket):
            waiter = queue.popleft()
            if waiter.future.done():  # timed out or cancelled
                continue
            self._admit(worker_id, waiter.ticket)
            waiter.future.set_result(None)

    def drop_worker(self, worker_id: str) -> None:
        """The worker left the cluster: its waiters fail now (and get retried elsewhere)
        instead of waiting for their deadline."""
        for waiter in self._queues.pop(worker_id, ()):
            if not waiter.future.done():
                waiter.future.set_exception(
                    WorkerFailedError(f"prefill worker {worker_id} left the cluster")
                )

    def num_waiting(self, worker_id: str | None = None) -> int:
        if worker_id is not None:
            return len(self._queues.get(worker_id, ()))
        return sum(len(q) for q in self._queues.values())
