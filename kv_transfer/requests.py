"""Per-request bookkeeping of the transfer protocol, one record per request and role.

Owned by the transport's I/O thread only: no locks here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from core.device_event import DeviceEvent
from core.kv_layout import KVLayout
from kv_transfer.api import SendHandle
from kv_transfer.handshake import LayersReady


@dataclass
class RecvState:
    """A reservation waiting to be filled."""

    request_id: str
    block_ids: tuple[int, ...]
    num_layers: int
    deadline: float
    peer: str | None = None
    landed: set[int] = field(default_factory=set)
    claimed: set[int] = field(default_factory=set)
    """Layers announced by the peer (landed, being pulled or held back until `ready`): each
    may arrive once."""
    ops: list[tuple[Any, list[int], float]] = field(default_factory=list)
    """Pulls in flight, with the layers each brings and when its read lease ends."""
    ready: DeviceEvent | None = None
    """Until it completes, queued device work still touches the blocks: nothing is pulled
    into them (`Transport.expect`); None once it has."""
    waiting: list[tuple[LayersReady, float]] = field(default_factory=list)
    """Layers announced before `ready` completed, with when each was read."""

    def __post_init__(self) -> None:
        self.block_set = frozenset(self.block_ids)

    def complete(self) -> bool:
        return len(self.landed) == self.num_layers

    def describe(self) -> str:
        return f"{len(self.landed)}/{self.num_layers} layers landed"

    def refusal(self, msg: LayersReady, peer_layout: KVLayout) -> str | None:
        """Why `msg` may not fill this reservation, or None if it may."""
        if self.peer is not None and self.peer != msg.sender:
            return f"request is bound to peer {self.peer}"
        if not msg.layers:
            return "no layers"
        for layer in msg.layers:
            if not 0 <= layer < self.num_layers:
                return f"layer {layer} outside [0, {self.num_layers})"
            if layer in self.claimed:
                return f"layer {layer} sent twice"
        dst = msg.dst_block_ids
        if len(dst) != len(self.block_ids) or set(dst) != self.block_set:
            return f"destination blocks {dst} are not the reservation"
        if len(msg.src_block_ids) != len(msg.dst_block_ids):
            return "source and destination block counts differ"
        try:
            peer_layout.check_block_ids(msg.src_block_ids, "source block id")
        except ValueError as exc:
            return str(exc)
        return None


@dataclass(frozen=True)
class GatedLayers:
    """One `send` call waiting for its layers' KV to be written (core.device_event)."""

    ready: DeviceEvent
    peer_layout: KVLayout
    layers: list[int]
    src: list[int]
    dst: list[int]
    tag: int


@dataclass
class SendState:
    """Layers offered to a peer, waiting for its acknowledgements."""

    request_id: str
    peer: str
    num_layers: int
    deadline: float
    block_ids: set[int] = field(default_factory=set)
    posted: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)
    handles: list[SendHandle] = field(default_factory=list)
    ops: list[Any] = field(default_factory=list)
    gated: deque[GatedLayers] = field(default_factory=deque)
    """Layers handed to `send` whose device event has not completed: not offered yet, in
    the order they came (a later layer never overtakes an earlier one)."""

    def complete(self) -> bool:
        return len(self.acked) == self.num_layers

    def describe(self) -> str:
        waiting = sum(len(g.layers) for g in self.gated)
        return (
            f"{len(self.posted)}/{self.num_layers} layers offered, {len(self.acked)} acknowledged"
            + (f", {waiting} still being computed" if waiting else "")
        )

    def pending_layers(self) -> set[int]:
        """Layers offered or waiting to be: each may be handed to `send` once."""
        return self.posted.union(*(g.layers for g in self.gated))

    def resolve_handles(self) -> None:
        for handle in self.handles:
            if not handle.done() and self.acked.issuperset(handle.layers):
                handle._finish(None)
        self.handles = [h for h in self.handles if not h.done()]
