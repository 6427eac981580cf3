"""Prefill admission: how much prompt work may be in flight at one prefill worker.

In disaggregated serving the decode worker reserves a prompt's KV blocks *before* the
prefill worker computes it (the prefill writes straight into them). A request queued
behind a long prefill backlog would hold those decode blocks idle for the whole wait: under
a burst the decode pool fills with reservations nobody is computing yet, and new requests
are refused although the decode worker is mostly idle. So the front door keeps a FIFO queue
per prefill worker, and a request reserves decode blocks and starts its prefill only while
that worker's in-flight uncached prompt tokens stay under a cap. A couple of engine steps'
worth keeps the prefill worker busy without holding decode blocks longer than needed.

A request is always admitted when nothing is in flight, however long its prompt. Written
here rather than with `asyncio.Semaphore` because admission is weighted by tokens and must
stay first-in, first-out (a semaphore would let short prompts overtake a long one forever).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from core.errors import WorkerFailedError


@dataclass
class _Waiter:
    request_id: str
    tokens: int
    future: asyncio.Future[None]


@dataclass
class _WorkerQueue:
    in_flight: dict[str, int] = field(default_factory=dict)
    """request id -> its admitted tokens."""
    in_flight_tokens: int = 0
    waiting: deque[_Waiter] = field(default_factory=deque)


class PrefillGate:
    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self._queues: dict[str, _WorkerQueue] = {}

    def _fits(self, q: _WorkerQueue, tokens: int) -> bool:
        return not q.in_flight or q.in_flight_tokens + tokens <= self.max_tokens

    def _admit(self, q: _WorkerQueue, request_id: str, tokens: int) -> None:
        q.in_flight[request_id] = tokens
        q.in_flight_tokens += tokens

    async def acquire(self, worker_id: str, request_id: str, tokens: int, timeout_s: float) -> None:
        """Wait (first in, first out) until `worker_id` may take `tokens` more prompt
        tokens. Raises TimeoutError after `timeout_s`, WorkerFailedError if the worker
        leaves meanwhile. Every successful acquire needs one `release`."""
        tokens = max(1, tokens)
        q = self._queues.setdefault(worker_id, _WorkerQueue())
        if not q.waiting and self._fits(q, tokens):
            self._admit(q, request_id, tokens)
            return
        waiter = _Waiter(request_id, tokens, asyncio.get_running_loop().create_future())
        q.waiting.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                if waiter.future.exception() is None:  # admitted as we gave up: hand it on
                    self.release(worker_id, request_id)
            else:
                waiter.future.cancel()
                if waiter in q.waiting:
                    q.waiting.remove(waiter)
                self._wake(q)  # a long head leaving may let the next ones in
            raise

    def release(self, worker_id: str, request_id: str) -> None:
        """The request's prefill finished (or failed): admit whoever now fits. Idempotent."""
        q = self._queues.get(worker_id)
        if q is None:
            return
        tokens = q.in_flight.pop(request_id, None)
        if tokens is None:
            return
        q.in_flight_tokens -= tokens
        self._wake(q)

    def _wake(self, q: _WorkerQueue) -> None:
        while q.waiting and self._fits(q, q.waiting[0].tokens):
            waiter = q.waiting.popleft()
            if waiter.future.done():  # timed out or cancelled
                continue
            self._admit(q, waiter.request_id, waiter.tokens)
            waiter.future.set_result(None)

    def drop_worker(self, worker_id: str) -> None:
        """The worker left the cluster: its waiters fail now (and get retried elsewhere)
        instead of waiting for their deadline."""
        q = self._queues.pop(worker_id, None)
        if q is None:
            return
        for waiter in q.waiting:
            if not waiter.future.done():
                waiter.future.set_exception(
                    WorkerFailedError(f"prefill worker {worker_id} left the cluster")
                )

    def in_flight_tokens(self, worker_id: str) -> int:
        q = self._queues.get(worker_id)
        return q.in_flight_tokens if q else 0

    def num_waiting(self, worker_id: str | None = None) -> int:
        if worker_id is not None:
            q = self._queues.get(worker_id)
            return len(q.waiting) if q else 0
        return sum(len(q.waiting) for q in self._queues.values())
