"""`local` backend: both caches live in this process (unified mode, unit tests).

Peers find each other by agent name in a process-wide table; a pull is a tensor copy
(CPU or CUDA) and a message is an append to the peer's inbox.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import torch

from core.kv_layout import KVLayout
from kv_transfer.driver import Driver, DriverError, OpState
from kv_transfer.layout import Region

_drivers: dict[str, LocalDriver] = {}
_drivers_lock = threading.Lock()


class LocalDriver(Driver):
    name = "local"

    def __init__(self, kv: torch.Tensor, layout: KVLayout, agent_name: str) -> None:
        super().__init__(kv, layout, agent_name)
        self._inbox: deque[bytes] = deque()  # appended by peers' I/O threads
        self._peers: dict[str, LocalDriver] = {}
        with _drivers_lock:
            if agent_name in _drivers:
                raise ValueError(f"local transport {agent_name!r} already exists")
            _drivers[agent_name] = self

    def metadata(self) -> bytes:
        return self.agent_name.encode()

    def connect(self, peer: str, metadata: bytes) -> None:
        with _drivers_lock:
            driver = _drivers.get(metadata.decode())
        if driver is None:
            raise DriverError(f"no local transport named {peer!r} in this process")
        self._peers[peer] = driver

    def disconnect(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def _peer(self, peer: str) -> LocalDriver:
        driver = self._peers.get(peer)
        with _drivers_lock:
            alive = driver is not None and _drivers.get(peer) is driver
        if not alive:
            raise DriverError(f"local peer {peer!r} is gone")
        assert driver is not None
        return driver

    def send_message(self, peer: str, message: bytes) -> None:
        self._peer(peer)._inbox.append(message)

    def messages(self) -> list[bytes]:
        out = []
        while self._inbox:
            out.append(self._inbox.popleft())
        return out

    def pull(self, peer: str, tag: int, regions: list[Region]) -> Any:
        src = self._peer(peer).kv_bytes
        for src_off, dst_off, nbytes in regions:
            self.kv_bytes[dst_off : dst_off + nbytes].copy_(src[src_off : src_off + nbytes])
        return None

    def state(self, op: Any) -> OpState:
        return OpState.DONE

    def close(self) -> None:
        with _drivers_lock:
            if _drivers.get(self.agent_name) is self:
                del _drivers[self.agent_name]
