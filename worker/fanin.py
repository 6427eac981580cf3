"""One request's transfer on a rank made of several transport requests, reported as one.

A rank whose peer is laid out otherwise (worker/landing.py) may send one request's KV to
several ranks of the peer (prefill TP smaller than decode TP: each decode rank needs some of
this rank's heads) or receive it from several (prefill TP larger: this rank's heads come
from several prefill ranks). Each such part is a transport request of its own, named by
its `wire_id`; the worker above counts one result per rank and request (worker/tracker.py).
`FanIn` turns the parts' results into that one: it ends when every part ended (none of
them still reads or writes the request's blocks), ok only if every part was, and a part
that fails cancels the others at once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from kv_transfer import Role, TransferResult


def wire_id(request_id: str, receiver_rank: int) -> str:
    """The transport request id of the part of `request_id` that goes to the receiving
    worker's rank `receiver_rank` (sender and receiver name it alike)."""
    return f"{request_id}@{receiver_rank}"


Part = tuple[Hashable, str]
"""(which transport, wire id): where one part of a request runs."""


@dataclass
class _Open:
    role: Role
    parts: dict[Part, Callable[[], None]]
    """Parts still running, each with the call that cancels it."""
    peer: str | None = None
    error: str | None = None
    ended: list[TransferResult] = field(default_factory=list)


class FanIn:
    def __init__(self) -> None:
        self._open: dict[str, _Open] = {}
        self._request_of: dict[Part, str] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._open

    def owns(self, part: Part) -> bool:
        return part in self._request_of

    def open(self, request_id: str, role: Role, parts: dict[Part, Callable[[], None]]) -> None:
        """`request_id` runs as `parts` (each with its cancel call)."""
        self._open[request_id] = _Open(role, dict(parts))
        for part in parts:
            self._request_of[part] = request_id

    def feed(self, part: Part, result: TransferResult) -> TransferResult | None:
        """A part's result; the request's own once it was the last part to end."""
        request_id = self._request_of.pop(part)
        req = self._open[request_id]
        req.parts.pop(part)
        req.ended.append(result)
        req.peer = req.peer or result.peer
        if not result.ok and req.error is None:
            req.error = f"{part[1]}: {result.error}"
            self.cancel(request_id)
        if req.parts:
            return None
        del self._open[request_id]
        return TransferResult(request_id, req.role, req.error is None, req.peer, (), req.error)

    def cancel(self, request_id: str) -> None:
        """Cancel every part still running (each still reports its result)."""
        req = self._open.get(request_id)
        if req is not None:
            for cancel in list(req.parts.values()):
                cancel()
