"""The sender's half of the transfer protocol (protocol.py): offering layers to a peer,
its acknowledgements, finishing or failing a send.

A send may come with a device event (core.device_event): its layers are offered only once
the event completed, in the order they were sent, so no READ ever sees KV still being
written on the GPU.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from core.device_event import DeviceEvent
from core.kv_layout import KVLayout
from kv_transfer.api import Role, SendHandle, TransferResult
from kv_transfer.driver import Driver, OpState
from kv_transfer.handshake import Abort, LayersDone, LayersReady, encode
from kv_transfer.holds import ReadHolds
from kv_transfer.layout import pair_regions_layers
from kv_transfer.requests import GatedLayers, RecvState, SendState

logger = logging.getLogger(__name__)


class _Done:
    """The event of a send that came without one, queued behind gated layers."""

    def query(self) -> bool:
        return True


_DONE = _Done()


class SenderSide:
    """Mixed into `TransferProtocol`, which owns the state below (see its __init__) and
    calls these on the I/O thread."""

    name: str
    driver: Driver
    layout: KVLayout
    read_lease_s: float
    _sends: dict[str, SendState]
    _finished: OrderedDict[str, None]
    _streaming: set[str]
    _gated: set[str]
    _holds: ReadHolds
    _deadlines: list[tuple[float, int, RecvState | SendState]]
    _deadline_seq: itertools.count
    _publish: Callable[[TransferResult], None]
    _bury: Callable[..., None]

    _remember: Callable[[str], None]  # these two: TransferProtocol's methods
    _tell: Callable[[str, Any], bool]

    def post_send(
        self,
        handle: SendHandle,
        peer: str,
        peer_layout: KVLayout,
        src: list[int],
        dst: list[int],
        layers: list[int],
        deadline: float,
        tag: int,
        ready: DeviceEvent | None = None,
    ) -> None:
        """`Transport.send`, on the I/O thread (its arguments already checked)."""
        send = self._sends.get(handle.request_id)
        if send is None:
            self._finished.pop(handle.request_id, None)
            send = SendState(handle.request_id, peer, self.layout.num_layers, deadline)
            self._sends[handle.request_id] = send
            heapq.heappush(self._deadlines, (deadline, next(self._deadline_seq), send))
        elif send.peer != peer:
            handle._finish(f"request {handle.request_id} is already being sent to {send.peer}")
            return
        again = (send.pending_layers() if send.gated else send.posted).intersection(layers)
        if again:
            handle._finish(f"layers {sorted(again)} of {handle.request_id} already sent")
            return
        send.block_ids.update(src)
        send.handles.append(handle)
        if send.gated or (ready is not None and not ready.query()):
            send.gated.append(GatedLayers(ready or _DONE, peer_layout, layers, src, dst, tag))
            self._gated.add(send.request_id)
            return
        self._offer(send, peer_layout, layers, src, dst, tag)

    def _offer(
        self,
        send: SendState,
        peer_layout: KVLayout,
        layers: list[int],
        src: list[int],
        dst: list[int],
        tag: int,
    ) -> bool:
        """Tell the peer `layers` are ready to read. False if that failed (send failed)."""
        send.posted.update(layers)
        peer = send.peer
        # Only byte-stream backends send the bytes themselves; the others let the receiver
        # pull, and it works the regions out from the message.
        regions = (
            pair_regions_layers(self.layout, peer_layout, layers, src, dst)
            if self.driver.streams_bytes
            else []
        )
        msg = LayersReady(send.request_id, self.name, layers, src, dst, tag, self.read_lease_s)
        try:
            op = self.driver.post_ready(peer, encode(msg), tag, regions)
        except Exception as exc:
            self._fail_send(send, f"offering layers to {peer} failed: {exc}", tell=False)
            return False
        if op is not None:
            send.ops.append(op)
            self._streaming.add(send.request_id)
        return True

    def _offer_written(self) -> bool:
        """Offer the gated layers whose device event completed, oldest first."""
        progressed = False
        for request_id in list(self._gated):
            send = self._sends.get(request_id)
            while send is not None and send.gated and send.gated[0].ready.query():
                g = send.gated.popleft()
                progressed = True
                if not self._offer(send, g.peer_layout, g.layers, g.src, g.dst, g.tag):
                    send = None
            if send is None or not send.gated:
                self._gated.discard(request_id)
        return progressed

    def _on_done(self, msg: LayersDone) -> None:
        if self._holds.on_done(msg.request_id, msg.sender, msg.layers):
            return
        send = self._sends.get(msg.request_id)
        if send is None or send.peer != msg.sender:
            logger.debug("%s: stray LayersDone for %s", self.name, msg.request_id)
            return
        send.acked.update(layer for layer in msg.layers if layer in send.posted)
        send.resolve_handles()
        if send.complete():
            self._finish_send(send)

    def _finish_send(self, send: SendState) -> None:
        pending = [op for op in send.ops if self.driver.state(op) is OpState.PENDING]
        if pending:
            return  # byte-stream sends settle right after the ack; finish on a later step
        for op in send.ops:
            self.driver.release(op)
        del self._sends[send.request_id]
        self._remember(send.request_id)
        self._publish(
            TransferResult(
                send.request_id, Role.SEND, True, send.peer, tuple(sorted(send.block_ids))
            )
        )

    def _fail_send(self, send: SendState, reason: str, tell: bool = True) -> None:
        del self._sends[send.request_id]
        self._remember(send.request_id)
        for handle in send.handles:
            handle._finish(reason)
        told = tell and self._tell(send.peer, Abort(send.request_id, self.name, reason))
        result = TransferResult(
            send.request_id, Role.SEND, False, send.peer, tuple(sorted(send.block_ids)), reason
        )
        if told and self._holds.needed(send):  # holds.py
            self._holds.hold(send, result)
        else:
            self._bury(send.ops, result)
