"""`PairedTransport`: the backend chosen per peer.

A worker's peers may be on its own host or on others. On the same host the `shm` backend
maps the peer's cache and copies at memory speed; UCX there goes through the kernel (cma)
at a fraction of that. Across hosts only a network backend works (NIXL, else UCX: RDMA,
NVLink or TCP, as the operator's UCX settings allow). So a worker registers its cache with
both and, for each peer, uses

    shm             when the peer is on this host (kv_transfer.host) and both have shm
    nixl, else ucx  otherwise, the first network backend both have
    cuda_ipc        a peer on this host, both caches in GPU memory, where neither has a
                    network backend (NIXL moves VRAM on a host as well; kv_transfer/
                    cuda_ipc_driver.py)
    (none)          IncompatiblePeerError naming what each side has and why ours lacks one

A worker where no backend starts (a GPU without IPC and no network backend installed, on one
host) gets a paired transport of none: it serves what moves no KV (a unified worker), and
pairing it with a peer fails naming why each backend is missing.

`local` is never chosen: it moves KV within one process only.

Every call naming a peer goes to that peer's transport; a request's reservation is armed on
the transport of the peer that will fill it (`expect(peer=...)`). Results of all transports
come back through one `poll`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec

from core.device_event import DeviceEvent
from kv_transfer.api import (
    PeerId,
    Role,
    SendHandle,
    TransferResult,
    Transport,
    UnknownPeerError,
)
from kv_transfer.handshake import (
    CompatRecord,
    IncompatiblePeerError,
    decode_peer_info,
    decode_versioned,
)
from kv_transfer.host import host_identity

NETWORK_BACKENDS = ("nixl", "ucx")
PAIRED_VERSION = 1


class PairedInfo(msgspec.Struct, frozen=True):
    """`PairedTransport.local_metadata()`: where we run, and each backend's handshake."""

    version: int
    host: str
    transports: dict[str, bytes]


_decoder = msgspec.msgpack.Decoder(PairedInfo)


class PairedTransport(Transport):
    def __init__(
        self,
        transports: Mapping[str, Transport],
        unavailable: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        """`transports`: one per backend, all over the same cache and under one name (none:
        `name` names it). `unavailable`: why each backend we lack could not be had (said
        when a peer needs one)."""
        self._transports = dict(transports)
        self._unavailable = dict(unavailable or {})
        names = {t.name for t in self._transports.values()} or ({name} if name else set())
        if len(names) != 1:
            raise ValueError(f"the paired transports must share one name, got {sorted(names)}")
        self.name = names.pop()
        self.backend = "+".join(self._transports) or "none"
        self.host = host_identity()
        info = PairedInfo(
            PAIRED_VERSION,
            self.host,
            {backend: t.local_metadata() for backend, t in self._transports.items()},
        )
        self._metadata = msgspec.msgpack.encode(info)
        self._by_peer: dict[PeerId, Transport] = {}
        self._by_request: dict[tuple[Role, str], Transport] = {}
        """Where each request in flight runs, so `wait` asks the right transport."""
        self.peer_backends: dict[PeerId, str] = {}
        """The backend each peer is reached over (for logs, tests and the operator)."""

    def local_metadata(self) -> bytes:
        return self._metadata

    def backend_for(self, peer_host: str, peer_backends: Sequence[str]) -> str:
        """The backend to a peer on `peer_host` that offers `peer_backends`."""
        if peer_host == self.host and "shm" in peer_backends and "shm" in self._transports:
            return "shm"
        for backend in NETWORK_BACKENDS:
            if backend in self._transports and backend in peer_backends:
                return backend
        if (
            peer_host == self.host
            and "cuda_ipc" in peer_backends
            and "cuda_ipc" in self._transports
        ):
            return "cuda_ipc"
        where = "this host" if peer_host == self.host else "another host"
        why = self._why()
        raise IncompatiblePeerError(
            f"transport (a peer on {where})",
            f"{sorted(self._transports)}" + (f" (unavailable here: {why})" if why else ""),
            sorted(peer_backends),
        )

    def _why(self) -> str:
        return "; ".join(f"{b}: {reason}" for b, reason in self._unavailable.items())

    def add_peer(self, metadata: bytes) -> PeerId:
        info: PairedInfo = decode_versioned(_decoder, metadata, "version", PAIRED_VERSION)
        backend = self.backend_for(info.host, list(info.transports))
        transport = self._transports[backend]
        peer = transport.add_peer(info.transports[backend])
        self._by_peer[peer] = transport
        self.peer_backends[peer] = backend
        return peer

    def remove_peer(self, peer: PeerId) -> None:
        transport = self._by_peer.pop(peer, None)
        self.peer_backends.pop(peer, None)
        if transport is not None:
            transport.remove_peer(peer)

    def expect(
        self,
        request_id: str,
        dst_block_ids: Sequence[int],
        num_layers: int | None = None,
        timeout_s: float = 30.0,
        peer: PeerId | None = None,
        ready: DeviceEvent | None = None,
    ) -> None:
        if peer is None:
            if len(self._transports) != 1:
                raise ValueError(
                    "a paired transport needs the peer that will fill the blocks"
                    if self._transports
                    else f"no KV transport here ({self._why()})"
                )
            transport = next(iter(self._transports.values()))
        else:
            transport = self._transport_of(peer)
        transport.expect(request_id, dst_block_ids, num_layers, timeout_s, peer, ready)
        self._by_request[(Role.RECV, request_id)] = transport

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
        transport = self._by_peer.get(peer)  # the per-layer path: two dict operations
        if transport is None:
            transport = self._transport_of(peer)
        self._by_request[(Role.SEND, request_id)] = transport
        return transport.send(
            request_id, src_block_ids, peer, dst_block_ids, layers, timeout_s, ready
        )

    def _transport_of(self, peer: PeerId) -> Transport:
        transport = self._by_peer.get(peer)
        if transport is None:
            raise UnknownPeerError(f"unknown peer {peer!r}; call add_peer first")
        return transport

    def cancel(self, request_id: str) -> None:
        for transport in self._transports.values():
            transport.cancel(request_id)

    def poll(self) -> list[TransferResult]:
        results = [r for t in self._transports.values() for r in t.poll()]
        for r in results:
            self._by_request.pop((r.role, r.request_id), None)
        return results

    def on_results(self, listener: Callable[[], None]) -> None:
        for transport in self._transports.values():
            transport.on_results(listener)

    def wait(self, request_id: str, role: Role, timeout_s: float) -> TransferResult:
        transport = self._by_request.pop((role, request_id), None)
        if transport is None:
            raise KeyError(f"no {role.value} of {request_id} in flight here")
        return transport.wait(request_id, role, timeout_s)

    def close(self) -> None:
        for transport in self._transports.values():
            transport.close()


def peer_compat(metadata: bytes) -> CompatRecord:
    """The compatibility record in a peer's `local_metadata()`, of a paired transport or of
    one backend's: the layout of the cache it registered."""
    try:
        info = _decoder.decode(metadata)
    except msgspec.DecodeError:
        return decode_peer_info(metadata).compat
    if info.version != PAIRED_VERSION:
        raise IncompatiblePeerError("version", PAIRED_VERSION, info.version)
    if not info.transports:
        raise IncompatiblePeerError("transport", "a backend", "none (the peer moves no KV)")
    return decode_peer_info(next(iter(info.transports.values()))).compat
