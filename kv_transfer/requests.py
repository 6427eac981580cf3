"""Per-request bookkeeping of the transfer protocol, one record per request and role.

Owned by the transport's I/O thread only: no locks here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kv_transfer.api import SendHandle


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
    """Layers announced by the peer (landed or being pulled): each may arrive once."""
    ops: list[tuple[Any, list[int]]] = field(default_factory=list)
    """Pulls in flight, with the layers each brings."""

    def __post_init__(self) -> None:
        self.block_set = frozenset(self.block_ids)

    def complete(self) -> bool:
        return len(self.landed) == self.num_layers

    def describe(self) -> str:
        return f"{len(self.landed)}/{self.num_layers} layers landed"


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

    def complete(self) -> bool:
        return len(self.acked) == self.num_layers

    def describe(self) -> str:
        return (
            f"{len(self.posted)}/{self.num_layers} layers offered, {len(self.acked)} acknowledged"
        )

    def resolve_handles(self) -> None:
        for handle in self.handles:
            if not handle.done() and self.acked.issuperset(handle.layers):
                handle._finish(None)
        self.handles = [h for h in self.handles if not h.done()]
