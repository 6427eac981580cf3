"""The handshake record two transports exchange before trusting each other, and the
control messages of the transfer protocol (see the package docstring for the protocol).

Both are msgspec Structs encoded as msgpack: compact, typed, and versioned by
`PROTOCOL_VERSION`. The transport that receives a record checks every field that changes
the meaning of a byte in the cache; a mismatch is refused with the field's name.
"""

from __future__ import annotations

from typing import Any

import msgspec

from core.kv_layout import LAYOUT_NAME, KVLayout
from core.preflight import UnpairableError

PROTOCOL_VERSION = 2
"""2: LayersReady carries a read lease; a receiver answers an Abort with Stopped."""

READ_LEASE_S = 4.0
"""How long after reading a LayersReady a receiver may still be pulling its blocks; a pull
that ends later is refused (see `kv_transfer.holds`)."""


class IncompatiblePeerError(UnpairableError):
    """A peer's handshake record does not match ours; `field` names the first mismatch."""

    def __init__(self, field: str, local: object, remote: object) -> None:
        super().__init__(f"incompatible KV peer: {field} is {remote!r} there, {local!r} here")
        self.field, self.local, self.remote = field, local, remote

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in a worker, it reaches the controller through Ray's pickling: rebuilt from
        # its fields (an exception is rebuilt from its message otherwise, which this
        # constructor refuses, and Ray hands on an UnserializableException instead).
        return type(self), (self.field, self.local, self.remote)


class CompatRecord(msgspec.Struct, frozen=True):
    """What must agree between two caches for a block to mean the same thing on both."""

    protocol_version: int
    model_id: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    layout: str
    tp_rank: int
    tp_size: int

    @classmethod
    def from_layout(cls, layout: KVLayout, model_id: str) -> CompatRecord:
        return cls(
            protocol_version=PROTOCOL_VERSION,
            model_id=model_id,
            dtype=layout.dtype,
            num_layers=layout.num_layers,
            num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim,
            block_size=layout.block_size,
            layout=LAYOUT_NAME,
            tp_rank=layout.tp_rank,
            tp_size=layout.tp_size,
        )

    def check(self, remote: CompatRecord) -> None:
        """Raise IncompatiblePeerError naming the first field that differs."""
        # Version first: a different version may give the other fields another meaning.
        for field in self.__struct_fields__:
            if getattr(self, field) != getattr(remote, field):
                raise IncompatiblePeerError(field, getattr(self, field), getattr(remote, field))


class PeerInfo(msgspec.Struct, frozen=True):
    """`Transport.local_metadata()`: everything a peer needs to talk to us."""

    protocol_version: int
    name: str
    backend: str
    compat: CompatRecord
    num_blocks: int
    backend_metadata: bytes

    def kv_layout(self) -> KVLayout:
        """The peer's cache: the geometry in its compatibility record (equal to ours once
        `CompatRecord.check` passed) with its own number of blocks."""
        compat = self.compat
        return KVLayout(
            num_layers=compat.num_layers,
            num_blocks=self.num_blocks,
            block_size=compat.block_size,
            num_kv_heads=compat.num_kv_heads,
            head_dim=compat.head_dim,
            dtype=compat.dtype,
            tp_rank=compat.tp_rank,
            tp_size=compat.tp_size,
        )


# --- control messages ---------------------------------------------------------------------


class LayersReady(msgspec.Struct, tag="ready", frozen=True, array_like=True):
    """Sender -> receiver: `layers` of the request are written in the sender's cache at
    `src_block_ids`; pull them into `dst_block_ids` (which must be the reservation).
    `tag` is unique per message from this sender; byte-stream backends tag the data with it.
    `lease_s`: a pull must end within this long of the receiver reading this message, or
    it is refused (an aborted sender reuses its blocks after twice that at the latest)."""

    request_id: str
    sender: str
    layers: list[int]
    src_block_ids: list[int]
    dst_block_ids: list[int]
    tag: int = 0
    lease_s: float = READ_LEASE_S


class LayersDone(msgspec.Struct, tag="done", frozen=True, array_like=True):
    """Receiver -> sender: `layers` landed; the sender may reuse their source blocks."""

    request_id: str
    sender: str
    layers: list[int]


class Abort(msgspec.Struct, tag="abort", frozen=True, array_like=True):
    """Either direction: the request failed on `sender`'s side; stop and release it."""

    request_id: str
    sender: str
    reason: str


class Stopped(msgspec.Struct, tag="stopped", frozen=True, array_like=True):
    """Receiver -> sender, answering an Abort once its pulls for the request finished or
    were cancelled: nothing here reads the request's source blocks any more."""

    request_id: str
    sender: str


Message = LayersReady | LayersDone | Abort | Stopped

_encoder = msgspec.msgpack.Encoder()
_message_decoder = msgspec.msgpack.Decoder(Message)
_peer_decoder = msgspec.msgpack.Decoder(PeerInfo)


def encode(obj: msgspec.Struct) -> bytes:
    return _encoder.encode(obj)


def decode_message(data: bytes) -> Message:
    return _message_decoder.decode(data)


def decode_versioned(
    decoder: msgspec.msgpack.Decoder, data: bytes, version_field: str, version: int
) -> Any:
    """Decode a peer's record; an undecodable one or another version is refused, naming it."""
    try:
        record = decoder.decode(data)
    except msgspec.DecodeError as exc:
        what = getattr(decoder.type, "__name__", "record")
        raise IncompatiblePeerError("metadata", what, f"undecodable ({exc})") from exc
    if getattr(record, version_field) != version:
        raise IncompatiblePeerError(version_field, version, getattr(record, version_field))
    return record


def decode_peer_info(data: bytes) -> PeerInfo:
    """Decode a peer's metadata; refuse other protocol versions before reading further."""
    return decode_versioned(_peer_decoder, data, "protocol_version", PROTOCOL_VERSION)
