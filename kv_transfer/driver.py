"""The backend seam: a `Driver` moves bytes and small messages; nothing else.

All protocol logic (reservations, validation, deadlines, acknowledgements) lives in
`kv_transfer.protocol`, identical for every backend. A driver is called from exactly one
thread, the transport's I/O thread, so it needs no locking of its own.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import Any

import torch

from core.kv_layout import KVLayout
from core.preflight import UnpairableError
from kv_transfer.handshake import LayersReady
from kv_transfer.layout import Region, pair_regions_layers


class OpState(enum.Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class DriverError(RuntimeError):
    """The backend reported a failure (peer gone, connection broken, bad descriptor)."""


class UnreachablePeerError(DriverError, UnpairableError):
    """A peer this backend cannot reach from here, for a reason no retry changes (on another
    host, its GPU not visible here, its memory not mappable): the controller refuses the
    pool at once instead of starting worker after worker that meets the same peer."""


class Driver(ABC):
    """Moves KV bytes between registered caches. Called only from the I/O thread.

    Ops are opaque handles returned by `post_ready` and `pull`; `state(op)` is polled until
    DONE or FAILED, and `release(op)` is called exactly once per op afterwards (or to abandon
    it: it returns False when the backend may still touch the memory, in which case the
    transport keeps polling and retries later).
    """

    name: str = ""
    streams_bytes: bool = False
    """True if the sender's `post_ready` sends the bytes (and so needs the regions); False
    if the receiver pulls them from memory the sender registered."""

    def __init__(self, kv: torch.Tensor, layout: KVLayout, agent_name: str) -> None:
        self.kv = kv
        self.kv_bytes = kv.reshape(-1).view(torch.uint8)
        """The whole cache as one flat byte tensor: what is registered."""
        self.layout = layout
        self.agent_name = agent_name

    @abstractmethod
    def metadata(self) -> bytes:
        """Backend connection info for peers (agent metadata, worker address, ...)."""

    @abstractmethod
    def connect(self, peer: str, metadata: bytes) -> None:
        """Make `peer` (its `metadata()`) reachable for messages and pulls."""

    @abstractmethod
    def disconnect(self, peer: str) -> None:
        """Forget `peer`; later calls naming it fail."""

    @abstractmethod
    def send_message(self, peer: str, message: bytes) -> None:
        """Send a small control message; raise DriverError if the peer is unreachable."""

    @abstractmethod
    def messages(self) -> list[bytes]:
        """Control messages that arrived since the last call (also drives progress)."""

    def post_ready(self, peer: str, message: bytes, tag: int, regions: list[Region]) -> Any:
        """Sender side: announce `message` (a LayersReady). Byte-stream backends also start
        sending the regions' source bytes tagged with `tag`. Returns an op or None."""
        self.send_message(peer, message)
        return None

    @abstractmethod
    def pull(self, peer: str, tag: int, regions: list[Region]) -> Any:
        """Receiver side: bring the regions' bytes from `peer` into our cache. Returns an op."""

    def pull_blocks(self, ready: LayersReady, peer_layout: KVLayout) -> Any:
        """`pull` of the blocks and layers a checked LayersReady names (peer_layout: the
        sender's cache). A backend that can copy blocks natively overrides this and skips
        the per-region list."""
        regions = pair_regions_layers(
            peer_layout, self.layout, ready.layers, ready.src_block_ids, ready.dst_block_ids
        )
        return self.pull(ready.sender, ready.tag, regions)

    @abstractmethod
    def state(self, op: Any) -> OpState:
        """Poll an op; raise nothing (a failure is OpState.FAILED)."""

    def wait_fds(self) -> list[int]:
        """File descriptors that become readable when a message arrives; the I/O thread
        waits on them instead of polling. Empty (the default): it polls."""
        return []

    def release(self, op: Any) -> bool:
        """Free an op's resources; False if it may still access memory (retry later)."""
        return True

    @abstractmethod
    def close(self) -> None:
        """Deregister memory and drop connections. Called once, after the I/O thread ended."""
