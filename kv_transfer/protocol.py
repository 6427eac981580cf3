"""The transfer protocol, run on the transport's I/O thread (see the package docstring).

Sender                                   Receiver (reserved dst blocks via expect)
  send(layers) --LayersReady(src, dst)-->  check: known request, same peer, layers new,
                                           dst == reservation, src inside sender's cache
                                           pull regions into OUR dst blocks (once the
                                           device let go of them: expect's `ready`)
               <--LayersDone(layers)----   when the pull completed
  all layers acked -> SEND ok              all layers landed -> RECV ok
  any failure / deadline -> Abort(reason) both ways, result FAILED, FailureHook
  cancelled / late --Abort-->             stop pulling (the Aborts of a read go first)
  src blocks held <--Stopped--             no pull in flight (holds.py); a pull ending >
  (<= 2 x lease)                           lease after its LayersReady was read: refused

The sender's half of the state machine is in sending.py; the receiver's, the dispatch,
the deadlines and what both roles share are here.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from core.device_event import DeviceEvent
from core.kv_layout import KVLayout
from kv_transfer import handshake
from kv_transfer.api import Role, TransferResult
from kv_transfer.driver import Driver, OpState
from kv_transfer.handshake import Abort, LayersDone, LayersReady, Stopped, decode_message, encode
from kv_transfer.holds import ReadHolds
from kv_transfer.requests import RecvState, SendState
from kv_transfer.sending import SenderSide
from kv_transfer.settling import Settling

logger = logging.getLogger(__name__)

_FINISHED_MEMORY = 4096  # how many finished request ids we remember, to quiet late messages


class TransferProtocol(SenderSide):
    """The protocol state machine: every request table of one transport, and the steps that
    move them. Every method runs on the transport's I/O thread (the transport submits its
    callers' commands there), so nothing here locks; the transport owns the thread.

    What it gets from the transport, and uses as given:
      `peers`         the connected peers' caches by name; the transport adds and removes
                      entries, this only reads them (one dict read is atomic)
      `run_commands`  run the commands queued on the I/O thread; True if there were any
      `publish`       report a finished request (a failure runs the FailureHook first)
    `read_lease_s` (default `handshake.READ_LEASE_S`): offered with each LayersReady; see
    holds.py.
    """

    def __init__(
        self,
        name: str,
        driver: Driver,
        layout: KVLayout,
        peers: Mapping[str, KVLayout],
        run_commands: Callable[[], bool],
        publish: Callable[[TransferResult], None],
        read_lease_s: float | None = None,
    ) -> None:
        self.name = name
        self.read_lease_s = handshake.READ_LEASE_S if read_lease_s is None else read_lease_s
        self.driver = driver
        self.layout = layout
        self._peers = peers
        self._run_commands = run_commands
        self._publish = publish
        self._recvs: dict[str, RecvState] = {}
        self._sends: dict[str, SendState] = {}
        # Failed requests whose ops may still touch their blocks (settling.py).
        self._settling = Settling(driver, publish)
        self._bury = self._settling.bury
        self._holds = ReadHolds(2 * self.read_lease_s, lambda s, r: self._bury(s.ops, r))
        self._finished: OrderedDict[str, None] = OrderedDict()
        # Requests with pulls in flight, so a step looks at those and not at every
        # reservation (a decode worker may hold hundreds waiting for their first layer).
        self._pulling: set[str] = set()
        self._streaming: set[str] = set()  # the same for sends with backend ops (byte streams)
        self._gated: set[str] = set()  # the same for sends with layers waiting on the device
        self._unready: set[str] = set()  # and for reservations whose blocks the device holds
        # Min-heap of (deadline, sequence, state): a step looks at the earliest only. Entries
        # of finished requests stay until their deadline passes and are skipped then.
        self._deadlines: list[tuple[float, int, RecvState | SendState]] = []
        self._deadline_seq = itertools.count()

    def active(self) -> bool:
        """Anything in flight (a request, a hold, a result settling)."""
        return bool(self._recvs or self._sends or self._settling or self._holds)

    def needs_polling(self, messages_wake_fds: bool) -> bool:
        """Whether something in flight shows its progress only to a poll: a backend op (an
        asynchronous pull, a byte stream, an op still settling), a send or a reservation
        waiting on a device event, or, where the driver's messages wake no fd, any request
        waiting for one. If not, the I/O thread may sleep on the fds until `next_deadline`."""
        if self._pulling or self._streaming or self._gated or self._unready or self._settling:
            return True
        return not messages_wake_fds and self.active()

    def next_deadline(self) -> float | None:
        """The earliest moment a step must run though no message came (monotonic clock): a
        request's deadline or a read hold's end. Early is harmless (the heap keeps entries of
        finished requests until their deadline passes); None if there is none."""
        first = self._deadlines[0][0] if self._deadlines else None
        expiry = self._holds.next_expiry()
        return min((t for t in (first, expiry) if t is not None), default=None)

    def step(self) -> bool:
        """One I/O step: queued commands, control messages, ops, deadlines. True if any of
        it made progress (the I/O thread then steps again without waiting)."""
        busy = self._run_commands()
        read_at = time.monotonic()  # taken before the read: a lease never starts late
        messages = []
        for raw in self.driver.messages():
            busy = True
            try:
                messages.append(decode_message(raw))
            except Exception as exc:
                logger.warning("%s: dropped undecodable message: %s", self.name, exc)
        # Aborts first: a LayersReady read together with its request's Abort was sent
        # before it, and its sender may reuse the blocks any time after (holds.py).
        messages.sort(key=lambda m: not isinstance(m, Abort))
        for message in messages:
            if isinstance(message, LayersReady):
                self._on_ready(message, read_at)
            elif isinstance(message, LayersDone):
                self._on_done(message)
            elif isinstance(message, Stopped):
                self._holds.on_stopped(message.request_id, message.sender)
            else:
                self._on_abort(message)
        busy |= self._offer_written()
        busy |= self._pull_ready()
        busy |= self._check_ops()
        self._check_deadlines()
        return busy

    # --- receiver ---------------------------------------------------------------------------

    def start_recv(
        self,
        request_id: str,
        block_ids: tuple[int, ...],
        layers: int,
        deadline: float,
        peer: str | None,
        ready: DeviceEvent | None = None,
    ) -> None:
        """`Transport.expect`, on the I/O thread (its arguments already checked)."""
        if request_id in self._recvs:
            # Keep the first reservation; the caller's second set of blocks is never used.
            logger.error("%s: request %s already has a reservation", self.name, request_id)
            return
        self._finished.pop(request_id, None)
        recv = RecvState(request_id, block_ids, layers, deadline, peer, ready=ready)
        self._recvs[request_id] = recv
        heapq.heappush(self._deadlines, (deadline, next(self._deadline_seq), recv))

    def _on_ready(self, msg: LayersReady, read_at: float) -> None:
        peer_layout = self._peers.get(msg.sender)
        if peer_layout is None:
            logger.warning("%s: LayersReady from unknown peer %s ignored", self.name, msg.sender)
            return
        recv = self._recvs.get(msg.request_id)
        if recv is None:
            # expect() is queued before the ids leave this process: run queued commands.
            self._run_commands()
            recv = self._recvs.get(msg.request_id)
        if recv is None:
            reason = (
                "request finished or cancelled"
                if msg.request_id in self._finished
                else ("no reservation for this request")
            )
            self._tell(msg.sender, Abort(msg.request_id, self.name, reason))
            return
        error = recv.refusal(msg, peer_layout)
        if error is not None:
            reason = f"refused LayersReady from {msg.sender}: {error}"
            if recv.peer != msg.sender:
                self._tell(msg.sender, Abort(msg.request_id, self.name, reason))
            self._fail_recv(recv, reason)
            return
        recv.peer = msg.sender
        recv.claimed.update(msg.layers)
        if recv.waiting or not self._blocks_free(recv):  # in order, once the device lets go
            if self._recvs.get(recv.request_id) is recv:  # (not failed by its event)
                recv.waiting.append((msg, read_at))
                self._unready.add(recv.request_id)
            return
        self._pull(recv, msg, peer_layout, read_at)

    def _blocks_free(self, recv: RecvState) -> bool:
        """Whether no queued device work touches the reservation's blocks any more (its
        `ready` event completed). An event that fails fails the reservation."""
        if recv.ready is None:
            return True
        try:
            done = recv.ready.query()
        except Exception as exc:
            self._fail_recv(recv, f"the device work queued before the reservation failed: {exc}")
            return False
        if done:
            recv.ready = None
        return done

    def _pull(
        self, recv: RecvState, msg: LayersReady, peer_layout: KVLayout, read_at: float
    ) -> None:
        try:
            op = self.driver.pull_blocks(msg, peer_layout)
        except Exception as exc:
            self._fail_recv(recv, f"pull from {msg.sender} failed: {exc}")
            return
        lease_end = read_at + msg.lease_s
        if self.driver.state(op) is OpState.DONE:  # a synchronous copy (shm, local)
            self._landed(recv, op, msg.layers, lease_end)
            return
        recv.ops.append((op, list(msg.layers), lease_end))
        self._pulling.add(recv.request_id)

    def _pull_ready(self) -> bool:
        """Pull the layers announced for reservations whose `ready` event has completed."""
        progressed = False
        for request_id in list(self._unready):
            recv = self._recvs.get(request_id)
            if recv is None or not recv.waiting:  # failed or cancelled meanwhile
                self._unready.discard(request_id)
                continue
            if not self._blocks_free(recv):
                continue  # pending; or failed by its event, then dropped at the next step
            self._unready.discard(request_id)
            waiting, recv.waiting = recv.waiting, []
            now = time.monotonic()
            for msg, read_at in waiting:
                peer_layout = self._peers.get(msg.sender)
                if peer_layout is None:
                    self._fail_recv(recv, f"peer {msg.sender} left", tell=False)
                    break
                if now > read_at + msg.lease_s:  # the sender may reuse its blocks: too late
                    self._fail_recv(
                        recv, f"layers {list(msg.layers)} waited past the sender's read lease "
                        "for the device to let go of the reservation's blocks",
                    )  # fmt: skip
                    break
                self._pull(recv, msg, peer_layout, read_at)
                if self._recvs.get(request_id) is not recv:  # it ended (failed, or all landed)
                    break
            progressed = True
        return progressed

    def _landed(self, recv: RecvState, op: Any, layers: list[int], lease_end: float) -> bool:
        """A pull finished: acknowledge its layers; publish the request if it is complete.
        False if the request ended here (complete, or failed: a late pull, a failed ack)."""
        self.driver.release(op)
        if time.monotonic() > lease_end:  # the sender may have reused the blocks meanwhile
            self._fail_recv(recv, f"pulling layers {layers} outlived the sender's read lease")
            return False
        recv.landed.update(layers)
        assert recv.peer is not None
        self._tell(recv.peer, LayersDone(recv.request_id, self.name, layers))
        if recv.request_id not in self._recvs:
            return False  # the acknowledgement failed and failed the request
        if not recv.complete():
            return True
        del self._recvs[recv.request_id]
        self._remember(recv.request_id)
        self._publish(TransferResult(recv.request_id, Role.RECV, True, recv.peer, recv.block_ids))
        return False

    def _fail_recv(
        self,
        recv: RecvState,
        reason: str,
        tell: bool = True,
        then: Callable[[], None] | None = None,
    ) -> None:
        del self._recvs[recv.request_id]
        self._remember(recv.request_id)
        if tell and recv.peer is not None:
            self._tell(recv.peer, Abort(recv.request_id, self.name, reason))
        result = TransferResult(
            recv.request_id, Role.RECV, False, recv.peer, recv.block_ids, reason
        )
        self._bury([op for op, _, _ in recv.ops], result, then)

    # --- both -------------------------------------------------------------------------------

    def _on_abort(self, msg: Abort) -> None:
        reason = f"peer {msg.sender} aborted: {msg.reason}"
        send = self._sends.get(msg.request_id)
        if send is not None and send.peer == msg.sender:
            self._fail_send(send, reason, tell=False)
            return
        if self._holds.on_stopped(msg.request_id, msg.sender):  # it gave up reading
            return
        stopped = Stopped(msg.request_id, self.name)  # the sender waits for it: holds.py
        recv = self._recvs.get(msg.request_id)
        if recv is not None and recv.peer in (None, msg.sender):
            recv.peer = msg.sender
            self._fail_recv(recv, reason, tell=False, then=lambda: self._tell(msg.sender, stopped))
        else:
            self._tell(msg.sender, stopped)

    def _check_ops(self) -> bool:
        progressed = False
        for request_id in list(self._pulling):
            recv = self._recvs.get(request_id)
            if recv is None or not recv.ops:
                self._pulling.discard(request_id)
                continue
            for entry in list(recv.ops):
                op, layers, lease_end = entry
                state = self.driver.state(op)
                if state is OpState.PENDING:
                    continue
                progressed = True
                if state is OpState.FAILED:
                    self._fail_recv(recv, f"pulling layers {layers} from {recv.peer} failed")
                    break
                recv.ops.remove(entry)
                if not self._landed(recv, op, layers, lease_end):
                    break
        for request_id in list(self._streaming):
            send = self._sends.get(request_id)
            if send is None:
                self._streaming.discard(request_id)
                continue
            if any(self.driver.state(op) is OpState.FAILED for op in send.ops):
                progressed = True
                self._fail_send(send, f"sending to {send.peer} failed")
            elif send.complete():
                self._finish_send(send)
        self._settling.check()
        return progressed

    def _check_deadlines(self) -> None:
        self._holds.expire()
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] < now:
            _, _, state = heapq.heappop(self._deadlines)
            if isinstance(state, RecvState):
                if self._recvs.get(state.request_id) is state:
                    self._fail_recv(state, f"deadline passed with {state.describe()}")
            elif self._sends.get(state.request_id) is state:
                self._fail_send(state, f"deadline passed with {state.describe()}")

    def _tell(self, peer: str, message: Any) -> bool:
        """Best effort: False if the peer is unreachable (it fails on its own deadline)."""
        try:
            self.driver.send_message(peer, encode(message))
            return True
        except Exception as exc:
            logger.info(
                "%s: could not send %s to %s: %s", self.name, type(message).__name__, peer, exc
            )
            if isinstance(message, LayersDone):
                recv = self._recvs.get(message.request_id)
                if recv is not None:
                    self._fail_recv(recv, f"peer {peer} unreachable: {exc}", tell=False)
            return False

    def _remember(self, request_id: str) -> None:
        self._finished[request_id] = None
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def cancel(self, request_id: str) -> None:
        if request_id in self._sends:
            self._fail_send(self._sends[request_id], "cancelled")
        if request_id in self._recvs:
            self._fail_recv(self._recvs[request_id], "cancelled")

    def drop_peer(self, peer: str) -> None:
        for send in [s for s in self._sends.values() if s.peer == peer]:
            self._fail_send(send, f"peer {peer} removed", tell=False)
        for recv in [r for r in self._recvs.values() if r.peer == peer]:
            self._fail_recv(recv, f"peer {peer} removed", tell=False)
        self.driver.disconnect(peer)

    def fail_all(self, reason: str) -> None:
        """Closing: the cache goes away with the transport, so nothing is held."""
        for send in list(self._sends.values()):
            self._fail_send(send, reason)
        for recv in list(self._recvs.values()):
            self._fail_recv(recv, reason)
        self._holds.release_all()
