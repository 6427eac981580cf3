"""Source blocks of a failed send that its receiver may still be reading.

The receiver pulls, so when a sender gives up on a request (cancelled, past its deadline)
the receiver may be in the middle of copying or READing the source blocks. Were they freed
at once, the next prompt prefilled into them could be taken, half old and half new, as this
request's KV by a receiver that then reports success. So the sender publishes its FAILED
result (which frees the blocks) only at the first of:

    Stopped        the receiver answered the Abort: its pulls ended or were cancelled
    LayersDone     for every layer offered and not yet acknowledged: those pulls ended
    hold_s         = 2 x the read lease: a receiver that is stuck or gone; it refuses any
                   pull that ends more than lease_s after it read that pull's LayersReady

Why that is enough: the Abort leaves at time A. A LayersReady that the receiver read at r
without the Abort in the same read was read before the Abort arrived, r < A + delay; its
pull is refused unless it ends by r + lease < A + lease + delay, and the blocks stay held
until A + 2 x lease: safe while a message takes less than a lease to arrive. A LayersReady
read together with the Abort comes after it (a step handles a read's Aborts first) and is
refused.

Failures that need no hold: the peer aborted (its pulls no longer matter), it was removed
or could not be sent the Abort (gone), or the transport is closing. The lease (4 s by
default) is long for one pull, which moves a layer's blocks, and for the wait before it
while the receiver's device still copies out of the reserved blocks (a step or so): a pull
that slow fails the request, which is retried.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kv_transfer.api import TransferResult
from kv_transfer.requests import SendState

logger = logging.getLogger(__name__)


@dataclass
class _Hold:
    send: SendState
    result: TransferResult
    until: float


class ReadHolds:
    """The held sends of one transport, by request id. I/O thread only: no locks.
    `release(send, result)` is called exactly once per hold."""

    def __init__(self, hold_s: float, release: Callable[[SendState, TransferResult], None]) -> None:
        self.hold_s = hold_s
        self._release = release
        self._holds: dict[str, _Hold] = {}

    def __bool__(self) -> bool:
        return bool(self._holds)

    def needed(self, send: SendState) -> bool:
        """Whether a failing `send` offered layers the receiver has not acknowledged."""
        return not send.acked.issuperset(send.posted)

    def hold(self, send: SendState, result: TransferResult) -> None:
        self._holds[send.request_id] = _Hold(send, result, time.monotonic() + self.hold_s)

    def on_stopped(self, request_id: str, peer: str) -> bool:
        """The receiver stopped reading (or gave up): True if a hold ended."""
        hold = self._holds.get(request_id)
        if hold is None or hold.send.peer != peer:
            return False
        self._end(request_id)
        return True

    def on_done(self, request_id: str, peer: str, layers: Iterable[int]) -> bool:
        """A LayersDone for a held send (True if it was one)."""
        hold = self._holds.get(request_id)
        if hold is None or hold.send.peer != peer:
            return False
        hold.send.acked.update(layers)
        if not self.needed(hold.send):
            self._end(request_id)
        return True

    def next_expiry(self) -> float | None:
        """When the first hold runs out (monotonic clock); None without holds."""
        return min((h.until for h in self._holds.values()), default=None)

    def expire(self) -> None:
        now = time.monotonic()
        for request_id in [r for r, h in self._holds.items() if h.until <= now]:
            logger.warning(
                "%s: receiver %s did not stop reading within %.1f s; its blocks are reused "
                "and a pull of them ending now is refused there",
                request_id,
                self._holds[request_id].send.peer,
                self.hold_s,
            )
            self._end(request_id)

    def release_all(self) -> None:
        for request_id in list(self._holds):
            self._end(request_id)

    def _end(self, request_id: str) -> None:
        hold = self._holds.pop(request_id)
        self._release(hold.send, hold.result)
