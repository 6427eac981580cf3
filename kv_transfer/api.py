"""The `Transport` interface the workers program against, and the types it returns."""

from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.device_event import DeviceEvent

PeerId = str
"""A peer's agent name, as returned by `Transport.add_peer`."""


class Role(enum.Enum):
    SEND = "send"
    RECV = "recv"


class TransferError(RuntimeError):
    """A transfer failed: timeout, peer gone, broken connection, protocol violation."""


class UnknownPeerError(ValueError):
    """No connection to that peer: never added, or removed (it left the cluster)."""


@dataclass(frozen=True)
class TransferResult:
    """How one request ended on one side. For RECV, `block_ids` is the reservation (now full
    of the peer's KV if `ok`, released if not); for SEND, the source blocks, which the
    engine may reuse either way."""

    request_id: str
    role: Role
    ok: bool
    peer: PeerId | None
    block_ids: tuple[int, ...]
    error: str | None = None


FailureHook = Callable[[TransferResult], None]
"""Called once per failed request (either role), on the transport's I/O thread, after the
transport stopped touching the request's blocks: free them here. Keep it short."""


class SendHandle:
    """One `send` call: completes when the receiver acknowledged every layer in it."""

    def __init__(self, request_id: str, layers: Sequence[int]) -> None:
        self.request_id = request_id
        self.layers = tuple(layers)
        self._error: str | None = None
        self._done = False
        # Held until the handle finishes; waiters take and hand it back. A bare lock, not a
        # threading.Event (a Condition in Python): one is made per layer per request.
        self._lock = threading.Lock()
        self._lock.acquire()

    def done(self) -> bool:
        return self._done

    @property
    def error(self) -> str | None:
        return self._error

    def wait(self, timeout_s: float) -> None:
        """Block until acknowledged; raise TransferError on failure or TimeoutError."""
        if not self._done:
            if not self._lock.acquire(timeout=max(timeout_s, 0.0)):
                raise TimeoutError(f"send of {self.request_id} layers {self.layers} still pending")
            self._lock.release()
        if self._error is not None:
            raise TransferError(self._error)

    def _finish(self, error: str | None) -> None:
        """I/O thread only (so never twice at once)."""
        if not self._done:
            self._error = error
            self._done = True
            self._lock.release()


class Transport(ABC):
    """Moves KV blocks of one registered cache to and from peers' caches.

    Thread-safety: every method may be called from any thread. The backend itself runs on
    one I/O thread owned by the transport; `FailureHook`s run on that thread.

    Lifecycle of a request (see the package docstring for the wire protocol):
      receiver: `expect(request_id, dst_block_ids, ...)` BEFORE the block ids are handed to
                the sender; then `wait`/`poll` until a `TransferResult` for RECV arrives.
      sender:   `send(request_id, src_ids, peer, dst_ids, layers)` once per finished layer
                (or once for all); the request is done when every layer was acknowledged.
    Each side's result is reported exactly once, through `poll` or `wait`, whichever takes
    it first.
    """

    name: str
    backend: str

    @abstractmethod
    def local_metadata(self) -> bytes:
        """Handshake bytes for peers: agent metadata plus the compatibility record."""

    @abstractmethod
    def add_peer(self, metadata: bytes) -> PeerId:
        """Check a peer's record (IncompatiblePeerError names the mismatching field) and
        connect. Idempotent for the same peer."""

    @abstractmethod
    def remove_peer(self, peer: PeerId) -> None:
        """Fail the requests in flight with `peer` and disconnect."""

    @abstractmethod
    def expect(
        self,
        request_id: str,
        dst_block_ids: Sequence[int],
        num_layers: int | None = None,
        timeout_s: float = 30.0,
        peer: PeerId | None = None,
        ready: DeviceEvent | None = None,
    ) -> None:
        """Reserve `dst_block_ids` for `request_id`: only they may be filled, and only by
        `peer` (None: by the first peer that sends for it). Nothing may read them before a
        successful RECV result; on failure or timeout the FailureHook releases them.
        `ready`: work queued on the device still touches the blocks (the offload tiers'
        copies) until this event completes; nothing is written into them before."""

    @abstractmethod
    def send(
        self,
        request_id: str,
        src_block_ids: Sequence[int],
        peer: PeerId,
        dst_block_ids: Sequence[int],
        layers: Sequence[int],
        timeout_s: float = 30.0,
        ready: DeviceEvent | None = None,
    ) -> SendHandle:
        """Offer `layers` of our blocks `src_block_ids` to `peer`'s reserved blocks
        `dst_block_ids` (pairwise). Non-blocking. The request's deadline is set by its first
        send. Our source blocks must stay unchanged until the handle completes. With
        `ready` (a device event recorded after the layers' KV writes), the layers are
        offered only once it completed; sends of a request are offered in call order."""

    @abstractmethod
    def cancel(self, request_id: str) -> None:
        """Abort a request on both roles here and tell the peer."""

    @abstractmethod
    def poll(self) -> list[TransferResult]:
        """Results (either role) that finished since the last poll, not yet taken."""

    @abstractmethod
    def on_results(self, listener: Callable[[], None]) -> None:
        """Call `listener` (on the transport's own thread; it must be quick) whenever a
        result becomes ready to `poll`, so an idle caller need not poll on a timer."""

    @abstractmethod
    def wait(self, request_id: str, role: Role, timeout_s: float) -> TransferResult:
        """Block until `request_id` finished in `role`; TimeoutError if not within
        `timeout_s` (the transfer goes on; its own deadline still applies)."""

    @abstractmethod
    def close(self) -> None:
        """Fail everything in flight, stop the I/O thread, release the backend."""
