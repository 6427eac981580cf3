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
queue will have churned the prefix out by its turn. The request still passes its worker's
gate after routing (the policy may pick a busy holder).

Who goes next at a worker's gate: the first in line, unless a waiter behind it has a longer
prefix of its prompt in that worker's cache (its KV events in the router's index;
`next_in_line`): then the longest goes first, so a queue that holds a prefix's requests runs
them while the prefix is still there instead of after the queue ahead has churned it out
(SGLang's scheduler orders its waiting queue by longest prefix match the same way). A waiter
passed over `RouterConfig.gate_max_skips` times goes next when it fits, so none waits
forever; 0 is first in, first out. On the simulated routing sweep (bench.routing.router_sweep, where
each simulated worker's queue is this gate) 39 of 39 runs meet the reuse and balance targets
with 4, 8 or 16 skips against 34 first in, first out; the burst pattern's reuse rises with
the bound, Mooncake's does not move (docs/performance.md, "Routing").

Before any of that, classes (core/fair_share.py): the waiters of the best `priority` go
first, and among those the tenant whose requests this door has served least (prompt tokens
charged as the gate admits them, output tokens as the door streams them); the longest-prefix
order and the skip bound apply within that class. Unrouted requests (late binding) go by
class too, first in within one. With fair share off and every priority equal there is one
class and the gate is as described above.

A request is always admitted when nothing is in flight, however long its prompt. Written
here rather than with `asyncio.Semaphore` because admission is weighted by tokens and its
order is the gate's own (a semaphore would let short prompts overtake a long one forever).
Runs on the front door's event loop only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.errors import WorkerFailedError
from core.fair_share import FairShare
from router.routing.route import Router
from router.routing.ticket import Ticket


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    future: asyncio.Future[None]
    block_hashes: Sequence[int] = ()
    priority: int = 0
    tenant: str = ""
    skips: int = 0
    """Times a later waiter of its class was admitted before it."""


@dataclass(eq=False)
class _Unrouted:
    route: Callable[[], Ticket]
    future: asyncio.Future[Ticket]
    priority: int = 0
    tenant: str = ""


_RECHECK_S = 0.5
"""How often an unrouted request checks for room itself (a worker that joined wakes no one)."""

LOOKAHEAD = 64
"""Waiters compared at one admission: the queue's first (bounds the index lookups a release
costs the front door's loop)."""


def next_in_line(
    held: Sequence[int], fits: Sequence[bool], head_skips: int, max_skips: int
) -> int | None:
    """Which waiter of a queue goes next, by position, or None: nobody may go now. `held`:
    the blocks of each one's prefix its worker caches; `fits`: whether it may go now. The
    head goes unless a waiter behind it that fits has a longer cached prefix than it (the
    longest of those goes, the earliest of equals); once the head has been passed over
    `max_skips` times nobody passes it."""
    best = 0 if fits[0] else None
    if head_skips >= max_skips:
        return best
    most = held[0]
    for i in range(1, len(held)):
        if fits[i] and held[i] > most:
            best, most = i, held[i]
    return best


class PrefillGate:
    def __init__(self, router: Router, max_tokens: int, fair: FairShare | None = None) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.router = router
        self.max_tokens = max_tokens
        self.fair = fair or FairShare()
        self._queues: dict[str, deque[_Waiter]] = {}
        self._unrouted: dict[str, deque[_Unrouted]] = {}  # model -> requests not routed yet
        self.num_bound_late = 0
        """Requests that waited unrouted for room (late binding) since start."""

    async def admit(
        self,
        ticket: Ticket,
        timeout_s: float,
        block_hashes: Sequence[int] = (),
        priority: int = 0,
        tenant: str = "",
    ) -> None:
        """Wait until the ticket's prefill worker may take its tokens and it is the ticket's
        turn (`next_in_line`: its prompt's chain `block_hashes` decides by what the worker
        caches), then admit the ticket. Raises TimeoutError after `timeout_s`,
        WorkerFailedError if the worker leaves meanwhile. The ticket frees the slot; nothing
        to release here."""
        worker_id = ticket.decision.prefill_worker_id
        if worker_id is None:
            raise ValueError("a request prefilled by its decode worker passes no gate")
        queue = self._queues.setdefault(worker_id, deque())
        if not queue and self._fits(worker_id, ticket):
            self._admit(worker_id, ticket, tenant)
            return
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(ticket, future, block_hashes, priority, tenant)
        self._rejoin(tenant)
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

    async def bind(
        self,
        model: str,
        route: Callable[[], Ticket],
        timeout_s: float,
        priority: int = 0,
        tenant: str = "",
    ) -> Ticket:
        """Late binding: wait (first in, first out for the model) until some prefill worker
        has room, then `route()` and return its ticket (the caller admits it at its worker's
        gate next, and closes it). `route` runs on this loop, maybe from another request's
        release; what it raises is raised here. TimeoutError after `timeout_s`."""
        queue = self._unrouted.setdefault(model, deque())
        if not queue and self._has_room(model):
            return route()
        waiter = _Unrouted(route, asyncio.get_running_loop().create_future(), priority, tenant)
        self._rejoin(tenant)
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
            waiter = self._first_of_class(queue)
            queue.remove(waiter)
            if waiter.future.done():  # timed out or cancelled
                continue
            try:
                waiter.future.set_result(waiter.route())
            except Exception as e:  # NoWorker, overloaded: that request's answer
                waiter.future.set_exception(e)

    def _fits(self, worker_id: str, ticket: Ticket) -> bool:
        admitted = self.router.admitted_tokens(worker_id)
        return not admitted or admitted + max(1, ticket.prefill_tokens) <= self.max_tokens

    def _admit(self, worker_id: str, ticket: Ticket, tenant: str) -> None:
        self.fair.charge(tenant, prompt_tokens=ticket.prefill_tokens)
        ticket.admit(on_release=lambda: self._wake(worker_id))

    def _class(self, waiter: _Waiter | _Unrouted) -> tuple[int, str]:
        return self.fair.class_of(waiter.priority, waiter.tenant)

    def _line(self, queue: deque[_Waiter]) -> list[_Waiter]:
        """The waiting (not given up) waiters of the class served next, in queue order,
        the first LOOKAHEAD of them."""
        live = [w for w in queue if not w.future.done()]
        best = self.fair.next_class({self._class(w) for w in live})
        return [w for w in live if self._class(w) == best][:LOOKAHEAD]

    def _first_of_class(self, queue: deque[_Unrouted]) -> _Unrouted:
        best = self.fair.next_class({self._class(w) for w in queue})
        return next(w for w in queue if self._class(w) == best)

    def _rejoin(self, tenant: str) -> None:
        """A tenant with nobody waiting here queues again: no credit for its idle time."""
        waiting = self.tenants_waiting()
        if not waiting.get(tenant):
            self.fair.rejoin(tenant, waiting)

    def tenants_waiting(self) -> dict[str, int]:
        """Requests waiting at this door's gates (routed or not), per tenant."""
        counts: dict[str, int] = {}
        for q in [*self._queues.values(), *self._unrouted.values()]:
            for w in q:
                if not w.future.done():
                    counts[w.tenant] = counts.get(w.tenant, 0) + 1
        return counts

    def _wake(self, worker_id: str) -> None:
        """Admit, one turn after another (`_next`), whoever now fits; then route unrouted
        requests into the room."""
        queue = self._queues.get(worker_id)
        held: dict[_Waiter, int] = {}  # its cached blocks, looked up once a wake
        while queue:
            if queue[0].future.done():  # timed out or cancelled
                queue.popleft()
                continue
            line = self._line(queue)
            if not line:
                queue.clear()  # every one of them gave up
                break
            i = self._next(worker_id, line, held)
            if i is None:
                break
            waiter = line[i]
            queue.remove(waiter)
            for passed in line[:i]:
                passed.skips += 1
            self._admit(worker_id, waiter.ticket, waiter.tenant)
            waiter.future.set_result(None)
        for model in [m for m, q in self._unrouted.items() if q]:
            self._bind_waiting(model)

    def _next(self, worker_id: str, line: list[_Waiter], known: dict[_Waiter, int]) -> int | None:
        """`next_in_line` over one class's waiters (`_line`): the blocks of each one's chain
        the worker's KV events say it holds (0 while the index is degraded), looked up once
        per waiter in `known`."""
        head, max_skips = line[0], self.router.config.gate_max_skips
        if head.skips >= max_skips or len(line) == 1:  # no lookups: the head's turn
            return 0 if self._fits(worker_id, head.ticket) else None
        held: list[int] = []
        fits: list[bool] = []
        for waiter in line:
            fits.append(not waiter.future.done() and self._fits(worker_id, waiter.ticket))
            blocks = known.get(waiter)
            if blocks is None:
                blocks = known[waiter] = self._held(worker_id, waiter)
            held.append(blocks)
        return next_in_line(held, fits, head.skips, max_skips)

    def _held(self, worker_id: str, waiter: _Waiter) -> int:
        if not waiter.block_hashes:
            return 0
        prefixes = self.router.store.longest_prefixes(
            waiter.ticket.decision.model, waiter.block_hashes
        )
        return prefixes.reported.get(worker_id, 0) if prefixes is not None else 0

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
