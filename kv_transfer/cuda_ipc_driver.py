"""`cuda_ipc` backend: workers on one host with their KV caches in GPU memory map each other's
cache through CUDA IPC and copy blocks device to device: a prefill and a decode worker
sharing one GPU (`baton serve --gpus-per-worker 0.5`), or GPUs both workers can see.

Why torch and not a library of our own choosing: torch's CUDA IPC (what torch.multiprocessing
shares CUDA tensors with: `UntypedStorage._share_cuda_` here, `_new_shared_cuda` there, as
torch.multiprocessing.reductions.rebuild_cuda_tensor calls them) is already in every worker,
and NIXL, which moves VRAM between processes of a host too (UCX's cuda_ipc), is a 60 MiB
install that a host may lack. Where both sides have a network backend (nixl, ucx), `auto`
keeps using it on this host too (kv_transfer/paired.py); this backend is the same-host path
for GPU caches without one.

How: each driver shares its whole cache once; a peer opens it (on the local device whose
UUID matches the sender's) read-only by convention, as the shm backend maps host caches. The
receiver pulls: one gather-scatter of the named blocks of the named layers, on its own CUDA
stream, from the sender's cache into its reserved blocks; the op is the event recorded after
it. The sender offered the layers only after their device event (kv_transfer/sending.py),
so the bytes are in place before the copy is queued. Control messages go over Unix sockets
(kv_transfer/unix_messages.py).
"""

from __future__ import annotations

from typing import Any

import msgspec
import torch

from core.kv_layout import KVLayout
from kv_transfer.driver import Driver, DriverError, OpState, UnreachablePeerError
from kv_transfer.handshake import LayersReady
from kv_transfer.host import host_identity
from kv_transfer.layout import Region
from kv_transfer.unix_messages import UnixMessages, UnixSocketMessaging


def device_uuid(index: int) -> str:
    """The GPU's UUID (the same in every process, whatever CUDA_VISIBLE_DEVICES numbers it)."""
    return str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))


def _local_index(uuid: str, peer_index: int) -> int:
    """Our index of the GPU the peer's cache is on; the peer's own index where UUIDs are not
    reported."""
    if not uuid:
        return peer_index
    for index in range(torch.cuda.device_count()):
        if device_uuid(index) == uuid:
            return index
    raise UnreachablePeerError(f"the peer's GPU ({uuid}) is not visible in this process")


class _Shared(msgspec.Struct, frozen=True):
    """What a peer needs to open our cache: the storage's IPC share and where in it the cache
    lies, its layout's block grid, and our control socket."""

    host: str
    uuid: str
    share: tuple[Any, ...]
    """`UntypedStorage._share_cuda_()`: device, handle, size, offset, ref counter, event."""
    offset_bytes: int
    num_layers: int
    num_blocks: int
    block_bytes: int
    address: str


class CudaIpcDriver(UnixSocketMessaging, Driver):
    name = "cuda_ipc"

    def __init__(self, kv: torch.Tensor, layout: KVLayout, agent_name: str) -> None:
        super().__init__(kv, layout, agent_name)
        if not kv.is_cuda:
            raise ValueError("the cuda_ipc backend moves GPU memory only; use shm for host caches")
        self._blocks = self.kv_bytes.view(layout.num_layers, layout.num_blocks, layout.block_bytes)
        self._stream = torch.cuda.Stream(kv.device)
        self._messages = UnixMessages(self.name, agent_name)
        storage = kv.untyped_storage()
        self._metadata = msgspec.msgpack.encode(
            _Shared(
                host_identity(),
                device_uuid(kv.device.index or 0),
                tuple(storage._share_cuda_()),
                kv.storage_offset() * kv.element_size(),
                layout.num_layers,
                layout.num_blocks,
                layout.block_bytes,
                self._messages.address,
            )
        )
        self._peers: dict[str, torch.Tensor] = {}
        """Each peer's cache as bytes [layers, blocks, block_bytes], opened on our side."""

    def metadata(self) -> bytes:
        return self._metadata

    def connect(self, peer: str, metadata: bytes) -> None:
        shared = msgspec.msgpack.decode(metadata, type=_Shared)
        if shared.host != host_identity():
            raise UnreachablePeerError(
                f"peer {peer} runs on another host: the cuda_ipc backend is same-host"
            )
        device = _local_index(shared.uuid, shared.share[0])
        try:
            with torch.cuda.device(device):
                storage = torch.UntypedStorage._new_shared_cuda(device, *shared.share[1:])
        except RuntimeError as exc:  # IPC refused here (a sandbox, no peer access)
            raise UnreachablePeerError(f"cannot open peer {peer}'s KV cache: {exc}") from exc
        nbytes = shared.num_layers * shared.num_blocks * shared.block_bytes
        cache = torch.empty(0, dtype=torch.uint8, device=f"cuda:{device}")
        cache.set_(storage, shared.offset_bytes, (nbytes,))
        self._messages.connect(peer, shared.address)
        self._peers[peer] = cache.view(shared.num_layers, shared.num_blocks, shared.block_bytes)

    def disconnect(self, peer: str) -> None:
        self._messages.disconnect(peer)
        cache = self._peers.pop(peer, None)
        if cache is not None:
            # Its last reference closes the IPC mapping (torch syncs only the default stream
            # then): every copy queued from it on ours ends first.
            self._stream.synchronize()
            del cache

    def _peer(self, peer: str) -> torch.Tensor:
        cache = self._peers.get(peer)
        if cache is None:
            raise DriverError(f"unknown peer {peer}")
        return cache

    def pull_blocks(self, ready: LayersReady, peer_layout: KVLayout) -> Any:
        source = self._peer(ready.sender)
        # Checked here, not by the copy: an index out of range is a device-side assert,
        # which ends the process's CUDA context.
        for what, ids, bound in (
            ("layer", ready.layers, min(source.shape[0], self._blocks.shape[0])),
            ("source block", ready.src_block_ids, source.shape[1]),
            ("destination block", ready.dst_block_ids, self._blocks.shape[1]),
        ):
            if ids and not (min(ids) >= 0 and max(ids) < bound):
                raise DriverError(f"a {what} id from {ready.sender} is outside [0, {bound})")
        with torch.cuda.stream(self._stream):
            device = self._blocks.device
            layers = _queued(ready.layers, device)[:, None]
            src = _queued(ready.src_block_ids, source.device)[None, :]
            dst = _queued(ready.dst_block_ids, device)[None, :]
            self._blocks[layers, dst] = source[layers.to(source.device), src].to(device)
            return self._record()

    def pull(self, peer: str, tag: int, regions: list[Region]) -> Any:
        source = self._peer(peer).view(-1)
        with torch.cuda.stream(self._stream):
            for src_off, dst_off, nbytes in regions:
                if src_off < 0 or src_off + nbytes > source.numel():
                    raise DriverError(f"region [{src_off}, +{nbytes}) outside peer {peer}'s cache")
                if dst_off < 0 or dst_off + nbytes > self.kv_bytes.numel():
                    raise DriverError(f"region [{dst_off}, +{nbytes}) outside our cache")
                self.kv_bytes[dst_off : dst_off + nbytes].copy_(
                    source[src_off : src_off + nbytes], non_blocking=True
                )
            return self._record()

    def _record(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(self._stream)
        return event

    def state(self, op: Any) -> OpState:
        return OpState.DONE if op is None or op.query() else OpState.PENDING

    def release(self, op: Any) -> bool:
        """A copy still queued writes into blocks a failed transfer's hook would free."""
        return op is None or op.query()

    def close(self) -> None:
        for peer in list(self._peers):
            self.disconnect(peer)
        self._messages.close()


def _queued(ids: list[int], device: torch.device) -> torch.Tensor:
    """`ids` on `device`, the copy queued on the current stream from pinned memory: a
    pageable copy would first wait for every pull queued before it."""
    return torch.tensor(ids, dtype=torch.long).pin_memory().to(device, non_blocking=True)
