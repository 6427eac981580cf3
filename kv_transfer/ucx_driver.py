"""`ucx` backend: ucxx tagged messages (the Python ucxx API exposes no RMA/remote keys).

Endpoints are created from exchanged worker addresses without endpoint error handling,
which lets UCX pick shared memory (cma, zero-copy) between processes of one host; the
listener path would force error handling and with it TCP only.

Tags (64 bits):
    control:  1 << 63                      (LayersReady / LayersDone / Abort, any peer)
    data:     0 | message tag (43) | region index (20)

The sender posts the control message and the data sends together; the receiver probes
control messages, and only after checking the reservation posts one receive per region
straight into its own reserved blocks. The receiver therefore decides where bytes land; a
message it refuses is never received (its rendezvous data never moves).
Without error handling a dead peer is detected by the request deadline.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from core.kv_layout import KVLayout
from kv_transfer.driver import Driver, DriverError, OpState
from kv_transfer.layout import Region

logger = logging.getLogger(__name__)

_CONTROL_TAG = 1 << 63
_INDEX_BITS = 20
_TAG_BITS = 43


def _data_tag(tag: int, index: int) -> int:
    if index >> _INDEX_BITS or tag >> _TAG_BITS:
        raise DriverError(f"tag {tag} / region index {index} exceed the tag layout")
    return (tag << _INDEX_BITS) | index


class UcxDriver(Driver):
    name = "ucx"
    streams_bytes = True

    def __init__(self, kv: torch.Tensor, layout: KVLayout, agent_name: str) -> None:
        super().__init__(kv, layout, agent_name)
        if kv.is_cuda:
            raise ValueError("the ucx backend moves host memory only; use nixl for VRAM")
        import ucxx._lib.libucxx as ucx_api
        from ucxx._lib.arr import Array

        self._api = ucx_api
        self._array = Array
        self._context = ucx_api.UCXContext(feature_flags=(ucx_api.Feature.TAG,))
        self._worker = ucx_api.UCXWorker(self._context)
        self._bytes = self.kv_bytes.numpy()
        self._endpoints: dict[str, Any] = {}
        self._control_sends: list[tuple[Any, np.ndarray]] = []
        self._control_recvs: list[tuple[Any, np.ndarray]] = []
        # Requests we stopped caring about but cannot cancel (ucxx exposes no per-request
        # cancel): kept referenced until UCX completes them.
        self._limbo: list[Any] = []

    def metadata(self) -> bytes:
        return bytes(self._worker.address.tobytes())

    def connect(self, peer: str, metadata: bytes) -> None:
        address = self._api.UCXAddress.create_from_buffer(metadata)
        self._endpoints[peer] = self._worker.create_endpoint_from_worker_address(address, False)

    def disconnect(self, peer: str) -> None:
        endpoint = self._endpoints.pop(peer, None)
        if endpoint is not None:
            try:
                endpoint.close()
            except Exception as exc:
                logger.debug("closing endpoint to %s: %s", peer, exc)

    def _endpoint(self, peer: str) -> Any:
        endpoint = self._endpoints.get(peer)
        if endpoint is None:
            raise DriverError(f"unknown peer {peer}")
        return endpoint

    def send_message(self, peer: str, message: bytes) -> None:
        buffer = np.frombuffer(message, dtype=np.uint8).copy()
        request = self._endpoint(peer).tag_send(
            self._array(buffer), self._api.UCXXTag(_CONTROL_TAG)
        )
        self._control_sends.append((request, buffer))

    def messages(self) -> list[bytes]:
        self._worker.progress()
        self._control_sends = [(r, b) for r, b in self._control_sends if not r.completed]
        self._limbo = [r for r in self._limbo if not r.completed]
        while True:
            probe = self._worker.tag_probe(self._api.UCXXTag(_CONTROL_TAG), remove=True)
            if not probe.matched:
                break
            buffer = np.empty(probe.length, dtype=np.uint8)
            request = self._worker.tag_recv_with_handle(self._array(buffer), probe)
            self._control_recvs.append((request, buffer))
        out: list[bytes] = []
        # In arrival order: a peer's LayersReady must be seen before its later messages.
        while self._control_recvs and self._control_recvs[0][0].completed:
            request, buffer = self._control_recvs.pop(0)
            try:
                request.check_error()
            except Exception as exc:
                logger.warning("control message lost: %s", exc)
                continue
            out.append(buffer.tobytes())
        return out

    def post_ready(self, peer: str, message: bytes, tag: int, regions: list[Region]) -> Any:
        endpoint = self._endpoint(peer)
        self.send_message(peer, message)
        requests = []
        for index, (src_off, _, nbytes) in enumerate(regions):
            view = self._bytes[src_off : src_off + nbytes]
            requests.append(
                endpoint.tag_send(self._array(view), self._api.UCXXTag(_data_tag(tag, index)))
            )
        return requests

    def pull(self, peer: str, tag: int, regions: list[Region]) -> Any:
        self._endpoint(peer)  # only known peers
        requests = []
        for index, (_, dst_off, nbytes) in enumerate(regions):
            view = self._bytes[dst_off : dst_off + nbytes]
            requests.append(
                self._worker.tag_recv(self._array(view), self._api.UCXXTag(_data_tag(tag, index)))
            )
        return requests

    def state(self, op: Any) -> OpState:
        if not all(request.completed for request in op):
            return OpState.PENDING
        for request in op:
            try:
                request.check_error()
            except Exception as exc:
                logger.info("UCX request failed: %s", exc)
                return OpState.FAILED
        return OpState.DONE

    def release(self, op: Any) -> bool:
        # A pending receive into a released reservation could still land if its sender is
        # alive; the receiver's Abort stops a live sender. See the package docstring.
        self._limbo.extend(request for request in op if not request.completed)
        return True

    def close(self) -> None:
        for peer in list(self._endpoints):
            self.disconnect(peer)
