"""An engine's waiting requests, in the classes of core/fair_share.py: the best priority
first, then the tenant served least, first in first out within a class. With fair share off
and every priority equal there is one class, and this is a FIFO queue."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator

from core.fair_share import FairShare
from engine.request import Request


class WaitQueue:
    def __init__(self, fair: FairShare) -> None:
        self.fair = fair
        self._classes: dict[tuple[int, str], deque[Request]] = {}
        self._tenants: Counter[str] = Counter()
        """Waiting requests per tenant (a tenant leaves when its count reaches 0)."""

    def append(self, req: Request) -> None:
        """A new request, at the back of its class."""
        if not self._tenants[req.tenant]:
            self.fair.rejoin(req.tenant, +self._tenants)
        self._queue_of(req).append(req)
        self._tenants[req.tenant] += 1

    def appendleft(self, req: Request) -> None:
        """A preempted request, at the front of its class (it is no new arrival: no lift)."""
        self._queue_of(req).appendleft(req)
        self._tenants[req.tenant] += 1

    def head(self) -> Request | None:
        """The request served next, or None."""
        cls = self.fair.next_class(self._classes)
        return None if cls is None else self._classes[cls][0]

    def popleft(self) -> Request:
        cls = self.fair.next_class(self._classes)
        if cls is None:
            raise IndexError("pop from an empty WaitQueue")
        req = self._classes[cls].popleft()
        self._left(req, cls)
        return req

    def remove(self, req: Request) -> None:
        """Take `req` out wherever it waits; ValueError if it does not."""
        cls = self._class(req)
        if req not in self._classes.get(cls, ()):
            raise ValueError(f"request {req.request_id} is not waiting")
        self._classes[cls].remove(req)
        self._left(req, cls)

    def oldest_arrival(self) -> float | None:
        """The earliest arrival among the requests waiting (each class's first)."""
        return min((q[0].arrival_time for q in self._classes.values()), default=None)

    def __len__(self) -> int:
        return sum(len(q) for q in self._classes.values())

    def __bool__(self) -> bool:
        return bool(self._classes)

    def __iter__(self) -> Iterator[Request]:
        for q in list(self._classes.values()):
            yield from q

    def __contains__(self, req: object) -> bool:
        if not isinstance(req, Request):
            return False
        return req in self._classes.get(self._class(req), ())

    def _class(self, req: Request) -> tuple[int, str]:
        return self.fair.class_of(req.priority, req.tenant)

    def _queue_of(self, req: Request) -> deque[Request]:
        return self._classes.setdefault(self._class(req), deque())

    def _left(self, req: Request, cls: tuple[int, str]) -> None:
        if not self._classes[cls]:
            del self._classes[cls]
        self._tenants[req.tenant] -= 1
