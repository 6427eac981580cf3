"""The ranks of one worker as the worker actor drives them, and its handshake bytes.

`EngineGroup` is what `AsyncEngine` steps and the worker calls on its engine thread:
`LocalGroup` at tp=1 (the one rank lives in the actor: plain method calls, no extra
process), `engine.tp.TPEngine` at tp>1 (every call goes to the rank actors in lockstep).
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from core.request import OutputDelta
from worker.rank import WorkerRank

GROUP_METADATA_VERSION = 1


class EngineGroup(Protocol):
    """call_all: every rank in lockstep, rank 0's result; call_first: rank 0 alone;
    call_each: every rank, every result (per-rank state such as transports)."""

    broken: str | None

    def call_all(self, name: str, *args: Any, **kwargs: Any) -> Any: ...
    def call_first(self, name: str, *args: Any, **kwargs: Any) -> Any: ...
    def call_each(self, name: str, *args: Any, **kwargs: Any) -> list[Any]: ...
    def step(self) -> list[OutputDelta]: ...
    def has_unfinished(self) -> bool: ...
    def abort(self, request_id: str) -> bool: ...
    def shutdown(self) -> None: ...


class LocalGroup:
    """tp=1: the single rank, in this process."""

    broken: str | None = None

    def __init__(self, rank: WorkerRank) -> None:
        self.rank = rank

    def call_all(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.rank, name)(*args, **kwargs)

    call_first = call_all

    def call_each(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [self.call_all(name, *args, **kwargs)]

    def step(self) -> list[OutputDelta]:
        return self.rank.engine.step()

    def has_unfinished(self) -> bool:
        return self.rank.engine.has_unfinished()

    def abort(self, request_id: str) -> bool:
        return self.rank.abort(request_id)

    def shutdown(self) -> None:
        self.rank.close()


class GroupMetadata(msgspec.Struct, frozen=True):
    """`WorkerInfo.transport_metadata`: one transport handshake per rank, in rank order.
    Rank r connects only to the peer's rank r, so both sides need the same TP size."""

    version: int
    worker_id: str
    tp_size: int
    ranks: list[bytes]


def encode_group_metadata(worker_id: str, ranks: list[bytes]) -> bytes:
    meta = GroupMetadata(GROUP_METADATA_VERSION, worker_id, len(ranks), list(ranks))
    return msgspec.msgpack.encode(meta)


def decode_group_metadata(data: bytes, local_worker_id: str, local_tp_size: int) -> GroupMetadata:
    """Decode a peer worker's metadata; refuse another version or another TP size."""
    try:
        meta = msgspec.msgpack.decode(data, type=GroupMetadata)
    except msgspec.DecodeError as e:
        raise ValueError(f"undecodable worker transport metadata: {e}") from e
    if meta.version != GROUP_METADATA_VERSION:
        raise ValueError(
            f"worker transport metadata version {meta.version}, expected {GROUP_METADATA_VERSION}"
        )
    if meta.tp_size != local_tp_size or len(meta.ranks) != meta.tp_size:
        raise ValueError(
            f"tensor-parallel size mismatch: worker {meta.worker_id} runs tp={meta.tp_size} "
            f"but {local_worker_id} runs tp={local_tp_size}; KV moves from each rank to the "
            "matching rank of the peer, so prefill and decode workers need the same TP size"
        )
    return meta
