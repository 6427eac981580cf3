"""`nixl` backend: a NIXL agent with its UCX backend; the receiver READs from the sender.

The whole cache is registered once (DRAM for a CPU tensor, VRAM for a CUDA one); a pull is
one READ request listing every (src, dst) region, built from numpy descriptor arrays so
that thousands of block-sized regions cost little. Control messages are NIXL notifications.
NIXL's own UCX endpoints detect a vanished peer: transfers and notifications to it then
raise NIXL_ERR_REMOTE_DISCONNECT, which fails the request at once instead of at its deadline.

The agent runs without NIXL's progress thread: on few cores a busy-polling thread costs
about half the bandwidth; the transport's I/O thread drives progress instead.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import numpy as np
import torch

from core.kv_layout import KVLayout
from kv_transfer.driver import Driver, DriverError, OpState
from kv_transfer.layout import Region

logger = logging.getLogger(__name__)


class NixlDriver(Driver):
    name = "nixl"

    def __init__(self, kv: torch.Tensor, layout: KVLayout, agent_name: str) -> None:
        super().__init__(kv, layout, agent_name)
        from nixl._api import nixl_agent, nixl_agent_config

        self._agent = nixl_agent(agent_name, nixl_agent_config(enable_prog_thread=False))
        self._mem_type = "VRAM" if kv.is_cuda else "DRAM"
        self._device = kv.get_device() if kv.is_cuda else 0
        self._base = kv.data_ptr()
        self._reg = self._agent.register_memory(self.kv_bytes)
        self._peers: dict[str, tuple[int, int]] = {}  # name -> (base address, device id)

    def metadata(self) -> bytes:
        return msgspec.msgpack.encode(
            (self._agent.get_agent_metadata(), self._base, self._device, self._mem_type)
        )

    def connect(self, peer: str, metadata: bytes) -> None:
        agent_md, base, device, mem_type = msgspec.msgpack.decode(metadata)
        if mem_type != self._mem_type:
            # Supported by NIXL, but our descriptor lists carry one memory type per request.
            raise DriverError(f"peer {peer} registered {mem_type}, we registered {self._mem_type}")
        name = self._agent.add_remote_agent(agent_md)
        name = name.decode() if isinstance(name, bytes) else name
        if name != peer:
            raise DriverError(f"NIXL metadata names agent {name!r}, handshake says {peer!r}")
        self._peers[peer] = (base, device)
        try:
            self._agent.make_connection(peer)
        except Exception as exc:
            raise DriverError(f"cannot connect to {peer}: {exc}") from exc

    def disconnect(self, peer: str) -> None:
        if self._peers.pop(peer, None) is not None:
            try:
                self._agent.remove_remote_agent(peer)
            except Exception as exc:
                logger.debug("removing NIXL agent %s: %s", peer, exc)

    def send_message(self, peer: str, message: bytes) -> None:
        if peer not in self._peers:
            raise DriverError(f"unknown peer {peer}")
        try:
            self._agent.send_notif(peer, message)
        except Exception as exc:
            raise DriverError(f"notification to {peer} failed: {exc}") from exc

    def messages(self) -> list[bytes]:
        out: list[bytes] = []
        for notifs in self._agent.get_new_notifs().values():
            out.extend(notifs)
        return out

    def pull(self, peer: str, tag: int, regions: list[Region]) -> Any:
        base, device = self._peers[peer]
        table = np.asarray(regions, dtype=np.uint64).reshape(-1, 3)
        local = np.empty((len(table), 3), dtype=np.uint64)
        remote = np.empty((len(table), 3), dtype=np.uint64)
        local[:, 0] = table[:, 1] + np.uint64(self._base)
        local[:, 1] = table[:, 2]
        local[:, 2] = self._device
        remote[:, 0] = table[:, 0] + np.uint64(base)
        remote[:, 1] = table[:, 2]
        remote[:, 2] = device
        try:
            handle = self._agent.initialize_xfer(
                "READ",
                self._agent.get_xfer_descs(local, self._mem_type),
                self._agent.get_xfer_descs(remote, self._mem_type),
                peer,
            )
            status = self._agent.transfer(handle)
        except Exception as exc:
            raise DriverError(f"READ from {peer} failed: {exc}") from exc
        if status == "ERR":
            self._agent.release_xfer_handle(handle)
            raise DriverError(f"READ from {peer} failed to post")
        return handle

    def state(self, op: Any) -> OpState:
        try:
            status = self._agent.check_xfer_state(op)
        except Exception as exc:
            logger.info("NIXL transfer failed: %s", exc)
            return OpState.FAILED
        return {"DONE": OpState.DONE, "PROC": OpState.PENDING}.get(status, OpState.FAILED)

    def release(self, op: Any) -> bool:
        try:
            self._agent.release_xfer_handle(op)
        except Exception as exc:
            # NIXL could not cancel an active transfer: it may still write our memory.
            logger.debug("NIXL handle not released yet: %s", exc)
            return False
        return True

    def close(self) -> None:
        for peer in list(self._peers):
            self.disconnect(peer)
        try:
            self._agent.deregister_memory(self._reg)
        except Exception as exc:
            logger.warning("NIXL deregistration failed: %s", exc)
