"""`shm` backend: peers on one host map each other's KV cache and copy with memcpy.

Why not UCX here: between processes of one host UCX (and NIXL over it) moves host memory
through the kernel (cma: process_vm_readv), measured at 5-9 GB/s on these machines, while
a copy from a mapping runs at memcpy speed (~20 GB/s for cache-warm blocks). xpmem/knem,
which would let UCX map peer memory, are kernel modules these hosts do not have.

How: the cache must live in a shared file mapping (the engine allocates CPU caches in a
memfd, engine/kv_cache/shared_memory.py); this driver finds that mapping in
/proc/self/maps and the fd that holds it, and a peer opens it read-only through
/proc/<pid>/fd/<n>. The receiver pulls (copies from the sender's mapping into its own
reserved blocks), so no process ever writes another's memory. Control messages go over Unix
sockets (kv_transfer/unix_messages.py); a dead sender's mapping stays readable, so a copy
never faults.

Only for peers on the same host and in the same pid namespace (checked at connect, with
a message naming the mismatch). The copy runs on the transport's I/O thread, all regions
of a message in one native call, single-threaded like the memcpy it is measured against.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from core.kv_layout import KVLayout
from kv_transfer.driver import Driver, DriverError, OpState, UnreachablePeerError
from kv_transfer.handshake import LayersReady
from kv_transfer.layout import Region
from kv_transfer.unix_messages import UnixMessages, UnixSocketMessaging

logger = logging.getLogger(__name__)


def _host_identity() -> tuple[str, str]:
    """(boot id, pid namespace): equal for two processes that can open each other's fds."""
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return boot_id, os.readlink("/proc/self/ns/pid")


def _backing_file(address: int, nbytes: int) -> tuple[int, int]:
    """(fd, file offset) of the shared file mapping holding [address, address + nbytes)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if not start <= address < end:
            continue
        if address + nbytes > end or fields[1][3] != "s":
            break
        major, minor = (int(x, 16) for x in fields[3].split(":"))
        inode = int(fields[4])
        for entry in os.listdir("/proc/self/fd"):
            try:
                st = os.stat(f"/proc/self/fd/{entry}")
            except OSError:
                continue
            # inode numbers are per file system: the device must match too
            same_dev = (os.major(st.st_dev), os.minor(st.st_dev)) == (major, minor)
            if inode and st.st_ino == inode and same_dev:
                return int(entry), int(fields[2], 16) + address - start
        break
    raise DriverError(
        "the shm backend needs the KV cache in a shared file mapping (a memfd, as the engine "
        "allocates CPU caches; see engine/kv_cache/shared_memory.py); this tensor is not"
    )


class _Peer:
    def __init__(self, mapping: mmap.mmap, offset: int, nbytes: int):
        self.mapping = mapping
        self.view = np.frombuffer(mapping, dtype=np.uint8)  # pins the mapping while in use
        self.base = self.view.ctypes.data + offset
        self.nbytes = nbytes

    def close(self) -> None:
        del self.view
        # a view still exported: the mapping goes with its last user
        with contextlib.suppress(BufferError):
            self.mapping.close()


class ShmDriver(UnixSocketMessaging, Driver):
    name = "shm"

    def __init__(
        self, kv: torch.Tensor, layout: KVLayout, agent_name: str, block_copy: Any = None
    ) -> None:
        """`block_copy`: a module with the compiled `copy_blocks` (the engine builds it:
        engine/cpu_kernels/copy_blocks.cpp); None copies each region with a ctypes.memmove,
        correct but ~5 us of Python each."""
        super().__init__(kv, layout, agent_name)
        if kv.is_cuda:
            raise ValueError("the shm backend moves host memory only; use nixl for VRAM")
        self._base = self.kv_bytes.data_ptr()
        self._nbytes = self.kv_bytes.numel()
        self._fd, self._file_offset = _backing_file(self._base, self._nbytes)
        self._messages = UnixMessages(self.name, agent_name)
        self._peers: dict[str, _Peer] = {}
        self._native = block_copy

    def metadata(self) -> bytes:
        boot_id, pid_ns = _host_identity()
        return msgspec.msgpack.encode(
            (boot_id, pid_ns, os.getpid(), self._fd, self._file_offset, self._nbytes,
             self._messages.address)
        )  # fmt: skip

    def connect(self, peer: str, metadata: bytes) -> None:
        boot_id, pid_ns, pid, fd, offset, nbytes, address = msgspec.msgpack.decode(metadata)
        here = _host_identity()
        if boot_id != here[0]:
            raise UnreachablePeerError(
                f"peer {peer} runs on another host: the shm backend is same-host"
            )
        if pid_ns != here[1]:
            raise UnreachablePeerError(f"peer {peer} runs in another pid namespace ({pid_ns})")
        try:
            file_fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY)
        except OSError as exc:
            raise DriverError(f"cannot open peer {peer}'s KV cache: {exc}") from exc
        try:
            mapping = mmap.mmap(file_fd, offset + nbytes, prot=mmap.PROT_READ)
        except (OSError, ValueError) as exc:
            raise DriverError(f"cannot map peer {peer}'s KV cache: {exc}") from exc
        finally:
            os.close(file_fd)
        try:
            self._messages.connect(peer, address)
        except DriverError:
            mapping.close()
            raise
        old = self._peers.pop(peer, None)
        if old is not None:
            old.close()
        self._peers[peer] = _Peer(mapping, offset, nbytes)

    def disconnect(self, peer: str) -> None:
        self._messages.disconnect(peer)
        state = self._peers.pop(peer, None)
        if state is not None:
            state.close()

    def _peer(self, peer: str) -> _Peer:
        state = self._peers.get(peer)
        if state is None:
            raise DriverError(f"unknown peer {peer}")
        return state

    def pull_blocks(self, ready: LayersReady, peer_layout: KVLayout) -> Any:
        if self._native is None:
            return super().pull_blocks(ready, peer_layout)
        state = self._peer(ready.sender)
        try:
            self._native.copy_blocks(
                self._base,
                self._nbytes,
                self.layout.layer_bytes,
                state.base,
                state.nbytes,
                peer_layout.layer_bytes,
                self.layout.block_bytes,
                ready.layers,
                ready.src_block_ids,
                ready.dst_block_ids,
            )
        except (IndexError, ValueError) as exc:
            raise DriverError(f"pull from {ready.sender}: {exc}") from exc
        return None

    def pull(self, peer: str, tag: int, regions: list[Region]) -> Any:
        state = self._peer(peer)
        for src_off, dst_off, nbytes in regions:
            if src_off < 0 or src_off + nbytes > state.nbytes:
                raise DriverError(f"region [{src_off}, +{nbytes}) outside peer {peer}'s cache")
            if dst_off < 0 or dst_off + nbytes > self._nbytes:
                raise DriverError(f"region [{dst_off}, +{nbytes}) outside our cache")
            ctypes.memmove(self._base + dst_off, state.base + src_off, nbytes)
        return None

    def state(self, op: Any) -> OpState:
        return OpState.DONE

    def close(self) -> None:
        for peer in list(self._peers):
            self.disconnect(peer)
        self._messages.close()
