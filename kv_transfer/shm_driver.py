"""`shm` backend: peers on one host map each other's KV cache and copy with memcpy.

Why not UCX here: between processes of one host UCX (and NIXL over it) moves host memory
through the kernel (cma: process_vm_readv), measured at 5-9 GB/s on these machines, while
a copy from a mapping runs at memcpy speed (~20 GB/s for cache-warm blocks). xpmem/knem,
which would let UCX map peer memory, are kernel modules these hosts do not have.

How: the cache must live in a shared file mapping (the engine allocates CPU caches in a
memfd, engine/kv_cache/shared_memory.py); this driver finds that mapping in
/proc/self/maps and the fd that holds it, and a peer opens it read-only through
/proc/<pid>/fd/<n>. The receiver pulls (copies from the sender's mapping into its own
reserved blocks), so no process ever writes another's memory. Control messages are
length-prefixed frames over Unix stream sockets (abstract names, one listener per
driver); a dead receiver shows as a broken pipe on send, a dead sender by the request
deadline (its mapping stays readable, so a copy never faults).

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
import select
import socket
import struct
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from core.kv_layout import KVLayout
from kv_transfer.driver import Driver, DriverError, OpState
from kv_transfer.handshake import LayersReady
from kv_transfer.layout import Region

logger = logging.getLogger(__name__)

_FRAME = struct.Struct("<I")
_SEND_TIMEOUT_S = 5.0


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
    def __init__(self, sock: socket.socket, mapping: mmap.mmap, offset: int, nbytes: int):
        self.sock = sock
        self.mapping = mapping
        self.view = np.frombuffer(mapping, dtype=np.uint8)  # pins the mapping while in use
        self.base = self.view.ctypes.data + offset
        self.nbytes = nbytes

    def close(self) -> None:
        self.sock.close()
        del self.view
        # a view still exported: the mapping goes with its last user
        with contextlib.suppress(BufferError):
            self.mapping.close()


class ShmDriver(Driver):
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
        self._address = f"\0baton-kv-shm-{os.getpid()}-{agent_name}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._address)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._inbound: list[tuple[socket.socket, bytearray]] = []
        self._peers: dict[str, _Peer] = {}
        self._native = block_copy

    def metadata(self) -> bytes:
        boot_id, pid_ns = _host_identity()
        return msgspec.msgpack.encode(
            (boot_id, pid_ns, os.getpid(), self._fd, self._file_offset, self._nbytes, self._address)
        )

    def connect(self, peer: str, metadata: bytes) -> None:
        boot_id, pid_ns, pid, fd, offset, nbytes, address = msgspec.msgpack.decode(metadata)
        here = _host_identity()
        if boot_id != here[0]:
            raise DriverError(f"peer {peer} runs on another host: the shm backend is same-host")
        if pid_ns != here[1]:
            raise DriverError(f"peer {peer} runs in another pid namespace ({pid_ns})")
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
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(_SEND_TIMEOUT_S)
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            mapping.close()
            raise DriverError(f"cannot reach peer {peer}'s control socket: {exc}") from exc
        old = self._peers.pop(peer, None)
        if old is not None:
            old.close()
        self._peers[peer] = _Peer(sock, mapping, offset, nbytes)

    def disconnect(self, peer: str) -> None:
        state = self._peers.pop(peer, None)
        if state is not None:
            state.close()

    def _peer(self, peer: str) -> _Peer:
        state = self._peers.get(peer)
        if state is None:
            raise DriverError(f"unknown peer {peer}")
        return state

    def send_message(self, peer: str, message: bytes) -> None:
        try:
            self._peer(peer).sock.sendall(_FRAME.pack(len(message)) + message)
        except OSError as exc:  # broken pipe, reset, timeout: the peer is gone or stuck
            raise DriverError(f"message to {peer} failed: {exc}") from exc

    def messages(self) -> list[bytes]:
        # One select() says which sockets have data: cheaper than a failing non-blocking
        # accept and recv on each of them every step.
        readable, _, _ = select.select(self.wait_fds(), [], [], 0)
        if not readable:
            return []
        ready = set(readable)
        if self._listener.fileno() in ready:
            while True:
                try:
                    conn, _ = self._listener.accept()
                except BlockingIOError:
                    break
                conn.setblocking(False)
                self._inbound.append((conn, bytearray()))
        out: list[bytes] = []
        alive = []
        for conn, buffer in self._inbound:
            closed = False
            while conn.fileno() in ready:
                try:
                    chunk = conn.recv(1 << 20)
                except BlockingIOError:
                    break
                except OSError:
                    closed = True
                    break
                if not chunk:
                    closed = True
                    break
                buffer += chunk
            while len(buffer) >= _FRAME.size:
                (length,) = _FRAME.unpack_from(buffer)
                if len(buffer) < _FRAME.size + length:
                    break
                out.append(bytes(buffer[_FRAME.size : _FRAME.size + length]))
                del buffer[: _FRAME.size + length]
            if closed:
                conn.close()
            else:
                alive.append((conn, buffer))
        self._inbound = alive
        return out

    def wait_fds(self) -> list[int]:
        return [self._listener.fileno(), *(conn.fileno() for conn, _ in self._inbound)]

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
        for conn, _ in self._inbound:
            conn.close()
        self._inbound = []
        self._listener.close()
