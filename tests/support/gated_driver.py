"""A `shm` driver whose pulls pass a gate the test holds: a closed gate keeps a pull (on the
transport's I/O thread, exactly where a slow copy or an uncancellable READ would be) until
the test opens it. Registered as backend `gated-shm`, so workers build it by name."""

from __future__ import annotations

import threading
from typing import Any

import torch

from core.kv_layout import KVLayout
from engine import cpu_kernels
from kv_transfer import register_backend
from kv_transfer.handshake import LayersReady
from kv_transfer.shm_driver import ShmDriver

BACKEND = "gated-shm"
_HOLD_LIMIT_S = 60.0
"""A forgotten gate lets the pull through after this long: no test hangs on it."""


class Gate:
    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.holding = threading.Event()
        """Set once a pull waits at the closed gate."""
        self.num_in_flight = 0
        """Pulls inside `pull_blocks` now (held or copying)."""

    def close(self) -> None:
        self.holding.clear()
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def pass_through(self) -> None:
        if not self._open.is_set():
            self.holding.set()
            self._open.wait(_HOLD_LIMIT_S)


class GatedShmDriver(ShmDriver):
    name = "shm"  # peers see a plain shm driver

    def __init__(
        self, kv: torch.Tensor, layout: KVLayout, agent_name: str, block_copy: Any = None
    ) -> None:
        super().__init__(kv, layout, agent_name, block_copy or cpu_kernels.load("copy_blocks"))
        self.gate = Gate()

    def pull_blocks(self, ready: LayersReady, peer_layout: KVLayout) -> Any:
        self.gate.num_in_flight += 1
        try:
            self.gate.pass_through()
            return super().pull_blocks(ready, peer_layout)
        finally:
            self.gate.num_in_flight -= 1


register_backend(BACKEND, f"{__name__}:GatedShmDriver", "mmap")
