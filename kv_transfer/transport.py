"""`DriverTransport`: the one implementation of `Transport`, over any `Driver`.

Threads: callers enqueue commands; one I/O thread owns the driver and the transport's
`TransferProtocol` (protocol.py: every request table), so the protocol runs
single-threaded. Results go back through a Condition.

The I/O loop, per step: run queued commands -> read control messages -> poll pulls and
sends -> enforce deadlines. Between steps it waits in select() on a wake pipe plus whatever
fds the driver says signal new messages (`shm`: its sockets, so a message is handled as it
arrives). While something in flight can only be polled (a backend op, a send waiting on a
device event, or any request where the driver's messages wake no fd: NIXL, UCX) it naps
~0.2 ms; while it only waits for messages that wake an fd, until the next deadline or hold
expiry (at most 1 s). Idle, the nap doubles from 5 ms up to 100 ms for a polled backend
(nothing a peer sends to an idle transport needs a quick answer: a transfer starts with a
local command) and to 1 s for one with fds. Neither may take the GIL from the engine
hundreds of times a second: polling while idle, this thread takes ~10% of a unified worker's
samples; polling while it waits on a peer (a decode worker's shm transport holding
reservations through a prefill worker's queue) it wakes ~500 times a second, and on two cores
every wake-up preempts an engine thread (the prefill worker's steps ran 1.4-1.5x the
profile's under load that way). A queued command writes the wake pipe whenever the I/O thread
naps longer than ~0.2 ms.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import queue
import random
import select
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from core.device_event import DeviceEvent
from core.kv_layout import KVLayout
from kv_transfer.api import (
    FailureHook,
    PeerId,
    Role,
    SendHandle,
    TransferError,
    TransferResult,
    Transport,
    UnknownPeerError,
)
from kv_transfer.driver import Driver
from kv_transfer.handshake import (
    PROTOCOL_VERSION,
    CompatRecord,
    IncompatiblePeerError,
    PeerInfo,
    decode_peer_info,
    encode,
)
from kv_transfer.protocol import TransferProtocol

logger = logging.getLogger(__name__)

_libc = ctypes.PyDLL(None)  # PyDLL: calls keep the GIL
_write_holding_gil = _libc.write
_write_holding_gil.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
_write_holding_gil.restype = ctypes.c_ssize_t

_ACTIVE_POLL_S = 0.0002
_IDLE_POLL_S = 0.005
_IDLE_POLL_MAX_S = 0.1
_IDLE_WAIT_MAX_S = 1.0
_CONNECT_TIMEOUT_S = 30.0
_CHECKED_MEMORY = 1024


def _until(deadline: float | None) -> float:
    """A nap that ends by `deadline` (monotonic), within [_ACTIVE_POLL_S, _IDLE_WAIT_MAX_S]."""
    if deadline is None:
        return _IDLE_WAIT_MAX_S
    return min(_IDLE_WAIT_MAX_S, max(_ACTIVE_POLL_S, deadline - time.monotonic()))


class DriverTransport(Transport):
    """A Transport whose bytes are moved by `driver_cls` (see `kv_transfer.registry`)."""

    def __init__(
        self,
        driver_factory: Callable[[str], Driver],
        layout: KVLayout,
        model_id: str,
        name: str | None = None,
        on_failure: FailureHook | None = None,
        read_lease_s: float | None = None,
    ) -> None:
        """`read_lease_s`: see kv_transfer.holds (None: handshake.READ_LEASE_S)."""
        self.layout = layout
        self.name = name or f"kv-{os.getpid()}-{random.getrandbits(32):08x}"
        self.driver = driver_factory(self.name)
        self.backend = self.driver.name
        self.compat = CompatRecord.from_layout(layout, model_id)
        self._metadata = encode(
            PeerInfo(
                protocol_version=PROTOCOL_VERSION,
                name=self.name,
                backend=self.backend,
                compat=self.compat,
                num_blocks=layout.num_blocks,
                backend_metadata=self.driver.metadata(),
            )
        )
        self._on_failure = on_failure
        self._listener: Callable[[], None] | None = None
        # Written under _cond; the protocol holds this same dict: mutate it, never rebind it.
        self._peers: dict[str, KVLayout] = {}
        self._checked: dict[str, tuple[str, list[int], list[int]]] = {}  # see _checked_blocks
        # Tags of byte-stream backends must be unique per receiver across senders: a random
        # 20-bit salt per transport and a 23-bit counter (see ucx_driver for the bit layout).
        self._tag_salt = random.getrandbits(20)
        self._tag_counter = itertools.count(1)
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._cond = threading.Condition()
        self._results: OrderedDict[tuple[Role, str], TransferResult] = OrderedDict()
        # The request tables and their state machine; touched only on the I/O thread.
        self._protocol = TransferProtocol(
            self.name,
            self.driver,
            layout,
            self._peers,
            self._drain_commands,
            self._publish,
            read_lease_s,
        )
        self._stop = False
        self._nap_s = _IDLE_POLL_S  # how long the I/O thread may sleep now (0 while it works)
        self._thread = threading.Thread(target=self._run, name=f"kv-io-{self.name}", daemon=True)
        self._thread.start()

    # --- public API (any thread) -----------------------------------------------------------

    def local_metadata(self) -> bytes:
        return self._metadata

    def add_peer(self, metadata: bytes) -> PeerId:
        info = decode_peer_info(metadata)
        if info.backend != self.backend:
            raise IncompatiblePeerError("backend", self.backend, info.backend)
        self.compat.check(info.compat)
        if info.name == self.name:
            raise ValueError("cannot add self as a peer")
        with self._cond:
            if info.name in self._peers:
                return info.name
        self._call(lambda: self.driver.connect(info.name, info.backend_metadata))
        peer_layout = info.kv_layout()
        with self._cond:
            self._peers[info.name] = peer_layout
        self._checked.clear()  # block ids were checked against the peer's previous cache
        logger.info("%s: connected to peer %s over %s", self.name, info.name, self.backend)
        return info.name

    def remove_peer(self, peer: PeerId) -> None:
        with self._cond:
            self._peers.pop(peer, None)
        self._checked.clear()
        self._call(lambda: self._protocol.drop_peer(peer))

    def expect(
        self,
        request_id: str,
        dst_block_ids: Sequence[int],
        num_layers: int | None = None,
        timeout_s: float = 30.0,
        peer: PeerId | None = None,
        ready: DeviceEvent | None = None,
    ) -> None:
        block_ids = tuple(int(b) for b in dst_block_ids)
        self.layout.check_block_ids(block_ids, "destination block id")
        layers = self.layout.num_layers if num_layers is None else num_layers
        if not 1 <= layers <= self.layout.num_layers:
            raise ValueError(f"num_layers {layers} outside [1, {self.layout.num_layers}]")
        if not block_ids:
            raise ValueError(f"request {request_id}: empty reservation")
        if peer is not None and peer not in self._peers:  # it would never send: say so now
            raise UnknownPeerError(f"unknown peer {peer!r}; call add_peer first")
        deadline = time.monotonic() + timeout_s
        self._submit(
            lambda: self._protocol.start_recv(request_id, block_ids, layers, deadline, peer, ready)
        )

    def send(
        self,
        request_id: str,
        src_block_ids: Sequence[int],
        peer: PeerId,
        dst_block_ids: Sequence[int],
        layers: Sequence[int],
        timeout_s: float = 30.0,
        ready: DeviceEvent | None = None,
    ) -> SendHandle:
        # The prefill loop calls this once per layer between kernels: keep it to builtins.
        peer_layout = self._peers.get(peer)  # one dict read: atomic, no lock needed
        if peer_layout is None:
            raise UnknownPeerError(f"unknown peer {peer!r}; call add_peer first")
        src, dst = self._checked_blocks(request_id, peer, peer_layout, src_block_ids, dst_block_ids)
        layer_list = list(map(int, layers))
        self.layout.check_layers(layer_list)
        if not layer_list:
            raise ValueError("send needs at least one layer")
        handle = SendHandle(request_id, layer_list)
        deadline = time.monotonic() + timeout_s
        tag = (self._tag_salt << 23) | (next(self._tag_counter) & 0x7FFFFF)
        self._submit(
            lambda: self._protocol.post_send(
                handle, peer, peer_layout, src, dst, layer_list, deadline, tag, ready
            )
        )
        return handle

    def _checked_blocks(
        self,
        request_id: str,
        peer: PeerId,
        peer_layout: KVLayout,
        src_block_ids: Sequence[int],
        dst_block_ids: Sequence[int],
    ) -> tuple[list[int], list[int]]:
        """The block lists as ints, checked. A request sends the same blocks for each layer:
        lists equal to the ones checked last time for it are taken as they are (comparing two
        lists is one C call; converting and checking them was half of a send's time)."""
        memo = self._checked.get(request_id)
        if (
            memo is not None
            and memo[0] == peer
            and type(src_block_ids) is list
            and type(dst_block_ids) is list
            and memo[1] == src_block_ids
            and memo[2] == dst_block_ids
        ):
            return memo[1], memo[2]
        src = list(map(int, src_block_ids))
        dst = list(map(int, dst_block_ids))
        if len(src) != len(dst) or not src:
            raise ValueError(f"need equal, non-empty block lists; got {len(src)} and {len(dst)}")
        self.layout.check_block_ids(src, "source block id")
        peer_layout.check_block_ids(dst, f"destination block id (peer {peer})")
        if len(self._checked) >= _CHECKED_MEMORY:
            self._checked.clear()  # requests come and go; a miss only costs a check
        self._checked[request_id] = (peer, src, dst)
        return src, dst

    def cancel(self, request_id: str) -> None:
        self._submit(lambda: self._protocol.cancel(request_id))

    def poll(self) -> list[TransferResult]:
        with self._cond:
            results = list(self._results.values())
            self._results.clear()
        return results

    def on_results(self, listener: Callable[[], None]) -> None:
        self._listener = listener

    def wait(self, request_id: str, role: Role, timeout_s: float) -> TransferResult:
        key = (role, request_id)
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._results, timeout_s):
                raise TimeoutError(f"{role.value} of {request_id} not finished in {timeout_s}s")
            return self._results.pop(key)

    def close(self) -> None:
        if self._stop:
            return
        self._call(lambda: self._protocol.fail_all("transport closed"))
        self._stop = True
        self._wake_up()
        self._thread.join(timeout=10.0)
        self.driver.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # --- plumbing --------------------------------------------------------------------------

    def _submit(self, command: Callable[[], None]) -> None:
        if self._stop:
            raise TransferError(f"transport {self.name} is closed")
        self._commands.put(command)
        # A short nap (something is in flight) ends within _ACTIVE_POLL_S anyway: skip the
        # wake-up write, a syscall that costs the caller 20-50 us on these VMs (the other
        # vCPU is kicked). Safe against a lost wake-up: see the nap in _run.
        if self._nap_s > _ACTIVE_POLL_S:
            self._wake_up()

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the I/O thread and return its result (re-raising its exception)."""
        future: Future[Any] = Future()

        def command() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self._submit(command)
        return future.result(timeout=_CONNECT_TIMEOUT_S)

    def _publish(self, result: TransferResult) -> None:
        """I/O thread: report a finished request; failures first go through the hook."""
        if not result.ok:
            logger.warning(
                "%s: %s of %s failed: %s",
                self.name,
                result.role.value,
                result.request_id,
                result.error,
            )
            if self._on_failure is not None:
                try:
                    self._on_failure(result)
                except Exception:
                    logger.exception("%s: on_failure hook raised", self.name)
        with self._cond:
            self._results[(result.role, result.request_id)] = result
            self._cond.notify_all()
        if self._listener is not None:
            try:
                self._listener()
            except Exception:
                logger.exception("%s: results listener raised", self.name)

    def _drain_commands(self) -> bool:
        if self._commands.empty():
            return False
        while not self._commands.empty():  # this thread is the only consumer
            self._commands.get_nowait()()
        return True

    def _run(self) -> None:
        if self.driver.kv.is_cuda:  # its events and copies: on the cache's GPU, not GPU 0
            import torch

            torch.cuda.set_device(self.driver.kv.device)
        step, active = self._protocol.step, self._protocol.active
        needs_polling = self._protocol.needs_polling
        idle_nap = _IDLE_POLL_S
        while not self._stop:
            try:
                busy = step()
            except Exception:
                logger.exception("%s: I/O step failed", self.name)
                busy = False
            if busy:
                idle_nap = _IDLE_POLL_S
                continue
            fds = [self._wake_r, *self.driver.wait_fds()]
            if needs_polling(len(fds) > 1):
                nap, idle_nap = _ACTIVE_POLL_S, _IDLE_POLL_S
            elif active():  # waiting for peers' messages, which wake an fd, and deadlines
                nap, idle_nap = _until(self._protocol.next_deadline()), _IDLE_POLL_S
            else:
                nap = idle_nap
                idle_nap = min(2 * idle_nap, _IDLE_WAIT_MAX_S if len(fds) > 1 else _IDLE_POLL_MAX_S)
            # Publish the nap length first, then look at the queue once more: a command put
            # after that look sees the length and wakes us if the nap is long.
            self._nap_s = nap
            if self._commands.empty():
                select.select(fds, [], [], nap)
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            self._nap_s = 0.0
        self._drain_commands()

    def _wake_up(self) -> None:
        # A full pipe (EAGAIN, ignored) means a wake-up is pending anyway. Written with the
        # GIL held: os.write would drop it, the I/O thread would wake and take it, and the
        # caller (the prefill loop, between two layers) would wait for the I/O thread's
        # whole step before it could go on; measured 20-450 us per send on 2 cores.
        _write_holding_gil(self._wake_w, b"x", 1)
