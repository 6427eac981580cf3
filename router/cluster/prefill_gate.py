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

Late binding (`bind`, with RouterConfig.late_binding): a request is not routed when it
arrives but when some prefill worker of its model has room (nobody waiting at its gate,
its admitted and gated tokens under the cap), first in, first out across the pool. The
routing decision then sees the caches as they are when the prefill can start: a prefix it
routes for is not evicted while the request waits, and it is not sent to a holder whose
queue will have churned the prefix out by its turn (docs/performance.md, issue 20). The
request still passes its worker's gate after routing (the policy may pick a busy holder).

A request is always admitted when nothing is in flight, however long its prompt. Written
here rather than with `asyncio.Semaphore` because admission is weighted by tokens and must
stay first-in, first-out (a semaphore would let short prompts overtake a long one forever).
Runs on the front door's event loop only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from core.errors import WorkerFailedError
from router.routing.router import Router
from router.routing.ticket import Ticket


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    future: asyncio.Future[None]


@dataclass(eq=False)
class _Unrouted:
    route: Callable[[], Ticket]
    future: asyncio.Future[Ticket]


_RECHECK_S = 0.5
"""How often an unrouted request looks for room itself (a worker that joined wakes no one)."""


class PrefillGate:
    def __init__(self, router: Router, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.router = router
        self.max_tokens = max_tokens
        self._queues: dict[str, deque[_Waiter]] = {}
        self._unrouted: dict[str, deque[_Unrouted]] = {}  # model -> requests not routed yet
        self.num_bound_late = 0
        """Requests that waited unrouted for room (late binding) since start."""

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

    async def bind(self, model: str, route: Callable[[], Ticket], timeout_s: float) -> Ticket:
        """Late binding: wait (first in, first out for the model) until some prefill worker
        has room, then `route()` and return its ticket (the caller admits it at its worker's
        gate next, and closes it). `route` runs on this loop, maybe from another request's
        release; what it raises is raised here. TimeoutError after `timeout_s`."""
        queue = self._unrouted.setdefault(model, deque())
        if not queue and self._has_room(model):
            return route()
        waiter = _Unrouted(route, asyncio.get_running_loop().create_future())
        queue.append(waiter)
        self.num_bound_late += 1
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise TimeoutError(f"no prefill worker had room within {timeout_s} s")
                try:
                    return await asyncio.wait_for(
                        asyncio.shield(waiter.future), min(left, _RECHECK_S)
                    )
                except TimeoutError:
                    self._bind_waiting(model)
        except BaseException:
            if waiter.future.done():
                if not waiter.future.cancelled() and waiter.future.exception() is None:
                    waiter.future.result().close()  # routed as we gave up: release it
            else:
                waiter.future.cancel()
                if waiter in queue:
                    queue.remove(waiter)
            raise

    def has_room(self, model: str) -> bool:
        """A request routed now would not wait unrouted: nobody does, and a worker has room."""
        return not self._unrouted.get(model) and self._has_room(model)

    def _has_room(self, model: str) -> bool:
        """Some prefill worker has nobody at its gate and admitted + gated tokens under the
        cap (an empty prefill pool has room: the decode worker prefills)."""
        in_flight = self.router.prefill_in_flight(model)
        return not in_flight or any(
            not self._queues.get(w) and tokens < self.max_tokens for w, tokens in in_flight.items()
        )

    def _bind_waiting(self, model: str) -> None:
        """Route, in order, the model's unrouted requests while a worker has room: each
        route charges its worker at once, so the next one sees the room that is left."""
        queue = self._unrouted.get(model)
        while queue and self._has_room(model):
            waiter = queue.popleft()
            if waiter.future.done():  # timed out or cancelled
                continue
            try:
                waiter.future.set_result(waiter.route())
            except Exception as e:  # NoWorker, overloaded: that request's answer
                waiter.future.set_exception(e)

    def _fits(self, worker_id: str, ticket: Ticket) -> bool:
        admitted = self.router.admitted_tokens(worker_id)
        return not admitted or admitted + max(1, ticket.prefill_tokens) <= self.max_tokens

    def _admit(self, worker_id: str, ticket: Ticket) -> None:
        ticket.admit(on_release=lambda: self._wake(worker_id))

    def _wake(self, worker_id: str) -> None:
        """Admit, in order, whoever now fits; then route unrouted requests into the room."""
        queue = self._queues.get(worker_id)
        while queue and self._fits(worker_id, queue[0].ticket):
            waiter = queue.popleft()
            if waiter.future.done():  # timed out or cancelled
                continue
            self._admit(worker_id, waiter.ticket)
            waiter.future.set_result(None)
        for model in [m for m, q in self._unrouted.items() if q]:
            self._bind_waiting(model)

    def drop_worker(self, worker_id: str) -> None:
        """The worker left the cluster: its waiters fail now (and get retried elsewhere)
        instead of waiting for their deadline."""
        for waiter in self._queues.pop(worker_id, ()):
            if not waiter.future.done():
                waiter.future.set_exception(
                    WorkerFailedError(f"prefill worker {worker_id} left the cluster")
                )

    def num_waiting(self, worker_id: str | None = None) -> int:
        """Requests waiting at a worker's gate (or at every gate, unrouted ones included)."""
        if worker_id is not None:
            return len(self._queues.get(worker_id, ()))
        unrouted = sum(len(q) for q in self._unrouted.values())
        return unrouted + sum(len(q) for q in self._queues.values())
