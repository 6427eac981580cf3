"""The ranks of one worker as the worker actor drives them, and its handshake bytes.

`RankGroup` is what `AsyncEngine` steps and the worker calls on its engine thread:
`LocalGroup` at tp=1 (the one rank lives in the actor: plain method calls, no extra
process), `engine.tp.TPEngine` at tp>1 (every call goes to the rank actors in lockstep).
Calls name a method of the rank class, not a string, so a reader (or a type checker) follows
them into the rank:

    group.all(WorkerRank.reserve, request, timeout_s, sender)   every rank, rank 0's result
    group.first(WorkerRank.num_in_flight)                         rank 0 alone (a read)
    group.each(WorkerRank.kv_poll)                                every rank, every result

Only `engine.tp` turns the method into its name, to cross into a rank's process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import msgspec

from core.request import OutputDelta
from worker.rank import WorkerRank

GROUP_METADATA_VERSION = 2
P = ParamSpec("P")
T = TypeVar("T")


class RankGroup(Protocol):
    broken: str | None

    def all(self, method: Callable[Concatenate[Any, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`method` on every rank in lockstep (state changes); rank 0's result."""

    def first(
        self, method: Callable[Concatenate[Any, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`method` on rank 0 alone (a read of state every rank shares)."""

    def each(
        self, method: Callable[Concatenate[Any, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> list[T]:
        """`method` on every rank; every rank's result, in rank order (per-rank state such as
        each rank's transport)."""

    def step(self) -> list[OutputDelta]: ...
    def has_unfinished(self) -> bool: ...
    def shutdown(self) -> None: ...


class LocalGroup:
    """tp=1: the single rank, in this process."""

    broken: str | None = None

    def __init__(self, rank: WorkerRank) -> None:
        self.rank = rank

    def all(self, method: Callable[Concatenate[Any, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        # Looked up on the rank, as a TP rank looks it up (engine/tp/driver.py): a role's
        # override of a `WorkerRank` method runs, whichever class named it.
        return getattr(self.rank, method.__name__)(*args, **kwargs)

    first = all

    def each(
        self, method: Callable[Concatenate[Any, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> list[T]:
        return [self.all(method, *args, **kwargs)]

    def step(self) -> list[OutputDelta]:
        return self.rank.step()

    def has_unfinished(self) -> bool:
        return self.rank.has_unfinished()

    def shutdown(self) -> None:
        self.rank.close()


class GroupMetadata(msgspec.Struct, frozen=True):
    """`WorkerInfo.transport_metadata`: one transport handshake per rank, in rank order.
    Two workers of one pool connect rank r to rank r (`connect`), so they need the same TP
    size; a decode worker answers a prefill worker of any TP size with `Routes`."""

    version: int
    worker_id: str
    tp_size: int
    ranks: list[bytes]


def encode_group_metadata(worker_id: str, ranks: list[bytes]) -> bytes:
    meta = GroupMetadata(GROUP_METADATA_VERSION, worker_id, len(ranks), list(ranks))
    return msgspec.msgpack.encode(meta)


def decode_group_metadata(
    data: bytes, local_worker_id: str, local_tp_size: int | None
) -> GroupMetadata:
    """Decode a peer worker's metadata; refuse another version, or another TP size than
    `local_tp_size` (None: any)."""
    try:
        meta = msgspec.msgpack.decode(data, type=GroupMetadata)
    except msgspec.DecodeError as e:
        raise ValueError(f"undecodable worker transport metadata: {e}") from e
    if meta.version != GROUP_METADATA_VERSION:
        raise ValueError(
            f"worker transport metadata version {meta.version}, expected {GROUP_METADATA_VERSION}"
        )
    if len(meta.ranks) != meta.tp_size:
        raise ValueError(
            f"worker {meta.worker_id} sent {len(meta.ranks)} ranks at tp={meta.tp_size}"
        )
    if local_tp_size is not None and meta.tp_size != local_tp_size:
        raise ValueError(
            f"tensor-parallel size mismatch: worker {meta.worker_id} runs tp={meta.tp_size} "
            f"but {local_worker_id} runs tp={local_tp_size}; workers of one pool connect "
            "rank to rank, so they need the same TP size"
        )
    return meta


class RouteTo(msgspec.Struct, frozen=True, array_like=True):
    """One receiving rank a sender rank writes to: that rank's transport metadata (its own
    cache's, or a landing area's: worker/landing.py), and `rank`, which names the part's
    wire id when the KV lands (worker/fanin.py; None: written straight into its cache)."""

    metadata: bytes
    rank: int | None


class Routes(msgspec.Struct, frozen=True):
    """A receiving worker's answer to a sender worker's `GroupMetadata`
    (`WorkerBase.accept`): per sender rank, the ranks it writes each prompt's KV to."""

    version: int
    worker_id: str
    ranks: list[list[RouteTo]]


def encode_routes(worker_id: str, ranks: list[list[RouteTo]]) -> bytes:
    return msgspec.msgpack.encode(Routes(GROUP_METADATA_VERSION, worker_id, ranks))


def decode_routes(data: bytes, local_tp_size: int) -> Routes:
    try:
        routes = msgspec.msgpack.decode(data, type=Routes)
    except msgspec.DecodeError as e:
        raise ValueError(f"undecodable routes: {e}") from e
    if routes.version != GROUP_METADATA_VERSION or len(routes.ranks) != local_tp_size:
        raise ValueError(
            f"routes of {routes.worker_id} (version {routes.version}) for "
            f"{len(routes.ranks)} sender ranks, expected version {GROUP_METADATA_VERSION}, "
            f"{local_tp_size} ranks"
        )
    return routes
