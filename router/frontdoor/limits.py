"""The front door's overload and abuse limits, as plain bookkeeping, shared by the HTTP door
(the middleware in http/guard.py) and the gRPC door (grpc/server.py): one `DoorControls`
per front-door process, so a key's quota and the door's slots count both. All off unless
configured.

    per API key   a token bucket (requests/s, burst) and a cap on requests in flight
                  -> 429 rate_limit_exceeded, Retry-After: when the next token is due
    whole door    at most `max_concurrent` requests in flight; up to `max_queued` more wait
                  for a slot, each at most `queue_timeout_s`
                  -> 503 server_overloaded (queue full, or the wait ran out), Retry-After

Why not a library: slowapi (limits) counts requests per window but has no concurrent-request
quota and no admission queue, and it hooks into each route; these are three small counters.
Single event loop: every method runs on the server's loop, so nothing locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True)
class DoorLimits:
    """`baton serve`'s --rate-limit, --rate-burst, --max-concurrent-per-key,
    --max-concurrent-requests, --max-queued-requests, --queue-timeout, --max-body-bytes."""

    rate_per_s: float | None = None
    burst: int | None = None
    """Requests a key may make at once after idling; default: one second's worth."""
    max_concurrent_per_key: int | None = None
    max_concurrent: int | None = None
    max_queued: int = 0
    queue_timeout_s: float = 30.0
    max_body_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("rate_per_s", "burst", "max_concurrent_per_key", "max_concurrent"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 (or unset), got {value}")
        if self.max_queued < 0 or self.queue_timeout_s <= 0:
            raise ValueError("max_queued must be >= 0 and queue_timeout_s > 0")
        if self.max_body_bytes is not None and self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0 (or unset), got {self.max_body_bytes}")

    def enabled(self) -> bool:
        return any(
            v is not None
            for v in (
                self.rate_per_s,
                self.max_concurrent_per_key,
                self.max_concurrent,
                self.max_body_bytes,
            )
        )


class Refusal(Exception):
    """A request turned away at the door: the status, OpenAI code and Retry-After to send."""

    def __init__(self, status: int, message: str, code: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.retry_after_s = max(1, math.ceil(retry_after_s))


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate, self.burst = rate_per_s, burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def take(self) -> float:
        """Take a token: 0.0 if there was one, else the seconds until one is due."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def full(self) -> bool:
        elapsed = time.monotonic() - self.stamp
        return self.tokens + elapsed * self.rate >= self.burst


class KeyQuotas:
    """Each API key's bucket and requests in flight (anonymous requests share the key "")."""

    _FORGET_AT = 10_000  # keys kept before idle ones (full bucket, nothing in flight) go

    def __init__(self, limits: DoorLimits) -> None:
        self.limits = limits
        self._buckets: dict[str, TokenBucket] = {}
        self.in_flight: dict[str, int] = {}

    def acquire(self, key: str) -> None:
        """Charge one request to `key`, or raise Refusal(429); `release` once it ends."""
        lim = self.limits
        cap = lim.max_concurrent_per_key
        if cap is not None and self.in_flight.get(key, 0) >= cap:
            raise Refusal(
                429,
                f"too many concurrent requests for this API key (limit {cap}); retry when "
                "one finishes",
                "rate_limit_exceeded",
                1.0,
            )
        if lim.rate_per_s is not None:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self._FORGET_AT:
                    self._forget_idle()
                burst = lim.burst or max(1, math.ceil(lim.rate_per_s))
                bucket = self._buckets[key] = TokenBucket(lim.rate_per_s, burst)
            wait_s = bucket.take()
            if wait_s > 0:
                raise Refusal(
                    429,
                    f"rate limit of {lim.rate_per_s:g} requests/s for this API key exceeded; "
                    f"retry in {wait_s:.1f} s",
                    "rate_limit_exceeded",
                    wait_s,
                )
        self.in_flight[key] = self.in_flight.get(key, 0) + 1

    def release(self, key: str) -> None:
        left = self.in_flight.get(key, 0) - 1
        if left > 0:
            self.in_flight[key] = left
        else:
            self.in_flight.pop(key, None)

    def _forget_idle(self) -> None:
        for key in [k for k, b in self._buckets.items() if b.full() and k not in self.in_flight]:
            del self._buckets[key]


class Admission:
    """At most `capacity` requests in flight; up to `max_queued` wait, FIFO, for a slot."""

    def __init__(self, capacity: int, max_queued: int, timeout_s: float) -> None:
        self.capacity, self.max_queued, self.timeout_s = capacity, max_queued, timeout_s
        self.in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def num_waiting(self) -> int:
        return len(self._waiters)

    async def enter(self) -> None:
        """Take a slot, waiting at most `timeout_s`; Refusal(503) if none; `leave` after."""
        if self.in_use < self.capacity and not self._waiters:
            self.in_use += 1
            return
        if len(self._waiters) >= self.max_queued:
            raise Refusal(
                503,
                f"the server is at capacity ({self.capacity} requests in flight, "
                f"{len(self._waiters)} waiting); retry later",
                "server_overloaded",
                self.timeout_s,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.timeout_s)
        except TimeoutError:
            if waiter.done():  # handed a slot as the wait ran out: take it
                return
            self._waiters.remove(waiter)
            raise Refusal(
                503,
                f"the server is at capacity: no request slot freed within "
                f"{self.timeout_s:g} s; retry later",
                "server_overloaded",
                self.timeout_s,
            ) from None
        except asyncio.CancelledError:  # the client went away while waiting
            if waiter.done():
                self.leave()
            else:
                self._waiters.remove(waiter)
            raise

    def leave(self) -> None:
        """A request ended: its slot passes to the longest waiter, or is freed."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_use -= 1


class DoorControls:
    """The limits' live state: per-key quotas and the door's admission (None: no cap)."""

    def __init__(self, limits: DoorLimits) -> None:
        self.limits = limits
        self.quotas = KeyQuotas(limits)
        self.admission = (
            Admission(limits.max_concurrent, limits.max_queued, limits.queue_timeout_s)
            if limits.max_concurrent is not None
            else None
        )

    @contextlib.asynccontextmanager
    async def admitted(self, key: str) -> AsyncIterator[None]:
        """Hold the key's quota and a door slot for the body (Refusal on entry if not)."""
        self.quotas.acquire(key)
        try:
            if self.admission is None:
                yield
                return
            await self.admission.enter()
            try:
                yield
            finally:
                self.admission.leave()
        finally:
            self.quotas.release(key)
