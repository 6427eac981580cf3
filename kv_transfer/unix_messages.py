"""Control messages between the same-host backends' drivers (shm, cuda_ipc): length-prefixed
frames over Unix stream sockets with abstract names, one listener per driver, one outgoing
socket per peer. A dead receiver shows as a broken pipe on send; a dead sender by the
request's deadline. Called only from the transport's I/O thread, like the drivers."""

from __future__ import annotations

import os
import select
import socket
import struct

from kv_transfer.driver import DriverError

_FRAME = struct.Struct("<I")
SEND_TIMEOUT_S = 5.0


class UnixMessages:
    def __init__(self, backend: str, agent_name: str) -> None:
        self.address = f"\0baton-kv-{backend}-{os.getpid()}-{agent_name}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.address)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._inbound: list[tuple[socket.socket, bytearray]] = []
        self._outbound: dict[str, socket.socket] = {}

    def connect(self, peer: str, address: str) -> None:
        """Reach `peer`'s listener at `address` (replacing an earlier connection to it)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(SEND_TIMEOUT_S)
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            raise DriverError(f"cannot reach peer {peer}'s control socket: {exc}") from exc
        self.disconnect(peer)
        self._outbound[peer] = sock

    def disconnect(self, peer: str) -> None:
        sock = self._outbound.pop(peer, None)
        if sock is not None:
            sock.close()

    def send(self, peer: str, message: bytes) -> None:
        sock = self._outbound.get(peer)
        if sock is None:
            raise DriverError(f"unknown peer {peer}")
        try:
            sock.sendall(_FRAME.pack(len(message)) + message)
        except OSError as exc:  # broken pipe, reset, timeout: the peer is gone or stuck
            raise DriverError(f"message to {peer} failed: {exc}") from exc

    def receive(self) -> list[bytes]:
        """Whole messages that arrived since the last call."""
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

    def close(self) -> None:
        for peer in list(self._outbound):
            self.disconnect(peer)
        for conn, _ in self._inbound:
            conn.close()
        self._inbound = []
        self._listener.close()


class UnixSocketMessaging:
    """A same-host driver's message methods (Driver's `send_message`, `messages`, `wait_fds`)
    over its `_messages`; listed before Driver in the driver's bases."""

    _messages: UnixMessages

    def send_message(self, peer: str, message: bytes) -> None:
        self._messages.send(peer, message)

    def messages(self) -> list[bytes]:
        return self._messages.receive()

    def wait_fds(self) -> list[int]:
        return self._messages.wait_fds()
