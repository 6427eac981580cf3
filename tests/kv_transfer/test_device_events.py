"""A layer sent with a device event is offered only once the event completed.

On a GPU the per-layer hook fires when the layer's kernels are launched, not run; the event
stands for "the stream got there". Here a fake event plays a late stream: until it
completes, the source blocks hold garbage, and completing it writes the real KV, exactly
what the GPU would do. A receiver that ever reads before completion gets the garbage.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from core.kv_layout import KVLayout
from engine import cpu_kernels
from engine.kv_cache.shared_memory import shared_zeros
from kv_transfer import Role, TransferError, TransferResult, create_transport

LAYOUT = KVLayout(num_layers=3, num_blocks=8, block_size=4, num_kv_heads=2, head_dim=8)
SRC, DST = [1, 4], [6, 2]
WAIT_S = 10.0


class Pending:
    """A device event: queued work (a layer's kernels, copies into a reservation's blocks)
    is not done until `finish`. Counts the transport's looks."""

    def __init__(self) -> None:
        self.queries = 0
        self._done = threading.Event()

    def query(self) -> bool:
        self.queries += 1
        return self._done.is_set()

    def synchronize(self) -> None:
        raise AssertionError("the transport's thread never waits on a device event")

    def finish(self) -> None:
        self._done.set()


class LateLayer(Pending):
    """Layer `layer` of blocks `SRC` is "being computed" (garbage) until `finish()`; the
    event completes only then. Counts the transport's looks, to know it saw the event."""

    def __init__(self, kv: torch.Tensor, layer: int, seed: int) -> None:
        super().__init__()
        self.kv, self.layer = kv, layer
        gen = torch.Generator().manual_seed(seed)
        self.real = torch.randn(kv[layer, SRC].shape, generator=gen).to(kv.dtype)
        kv[layer, SRC] = torch.full_like(self.real, 7.0)

    def finish(self) -> None:
        self.kv[self.layer, SRC] = self.real
        super().finish()

    def seen(self, times: int = 3) -> None:
        """Wait until the I/O thread looked at the event `times` times."""
        deadline = time.monotonic() + WAIT_S
        while self.queries < times:
            assert time.monotonic() < deadline, "the transport never looked at the event"
            time.sleep(0.001)


class Side:
    def __init__(self, backend: str, seed: int) -> None:
        kv = torch.randn(LAYOUT.shape, generator=torch.Generator().manual_seed(seed)).half()
        self.kv = shared_zeros(LAYOUT.shape, kv.dtype).copy_(kv) if backend == "shm" else kv
        self.failures: list[TransferResult] = []
        self.transport = create_transport(
            self.kv,
            LAYOUT,
            "m",
            backend=backend,
            on_failure=self.failures.append,
            block_copy=cpu_kernels.load("copy_blocks"),
        )


@pytest.fixture(params=["local", "shm"])
def sides(request):
    prefill, decode = Side(request.param, 1), Side(request.param, 2)
    to_decode = prefill.transport.add_peer(decode.transport.local_metadata())
    decode.transport.add_peer(prefill.transport.local_metadata())
    yield prefill, decode, to_decode
    prefill.transport.close()
    decode.transport.close()


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_a_layer_is_read_only_after_its_event_and_in_order(sides) -> None:
    prefill, decode, to_decode = sides
    before = decode.kv.clone()
    decode.transport.expect("r", DST, timeout_s=WAIT_S)
    late = LateLayer(prefill.kv, 0, seed=3)
    handles = [prefill.transport.send("r", SRC, to_decode, DST, [0], WAIT_S, late)]
    # Layers 1 and 2 are written already, but may not overtake layer 0.
    handles += [prefill.transport.send("r", SRC, to_decode, DST, [i], WAIT_S) for i in (1, 2)]
    late.seen()
    assert not any(h.done() for h in handles)
    assert torch.equal(as_bytes(decode.kv[:, DST]), as_bytes(before[:, DST])), "read early"
    late.finish()
    assert decode.transport.wait("r", Role.RECV, WAIT_S).ok
    assert prefill.transport.wait("r", Role.SEND, WAIT_S).ok
    for h in handles:
        h.wait(WAIT_S)
    assert torch.equal(as_bytes(decode.kv[:, DST]), as_bytes(prefill.kv[:, SRC]))
    assert torch.equal(as_bytes(decode.kv[0, DST]), as_bytes(late.real))


def test_a_layer_never_written_fails_at_the_deadline_unread(sides) -> None:
    prefill, decode, to_decode = sides
    before = decode.kv.clone()
    decode.transport.expect("r", DST, timeout_s=WAIT_S)
    late = LateLayer(prefill.kv, 1, seed=4)
    handle = prefill.transport.send("r", SRC, to_decode, DST, [1], 0.3, late)
    result = prefill.transport.wait("r", Role.SEND, WAIT_S)
    assert not result.ok and "1 still being computed" in (result.error or "")
    with pytest.raises(TransferError):
        handle.wait(WAIT_S)
    assert not decode.transport.wait("r", Role.RECV, WAIT_S).ok  # told by the Abort
    late.finish()  # the stream gets there after all: nothing is offered any more
    time.sleep(0.05)
    assert torch.equal(as_bytes(decode.kv), as_bytes(before))


def test_cancel_drops_layers_still_waiting_for_their_event(sides) -> None:
    prefill, decode, to_decode = sides
    before = decode.kv.clone()
    decode.transport.expect("r", DST, timeout_s=WAIT_S)
    late = LateLayer(prefill.kv, 2, seed=5)
    handle = prefill.transport.send("r", SRC, to_decode, DST, [2], WAIT_S, late)
    late.seen()
    prefill.transport.cancel("r")
    with pytest.raises(TransferError):
        handle.wait(WAIT_S)
    assert not decode.transport.wait("r", Role.RECV, WAIT_S).ok
    late.finish()
    queries = late.queries
    time.sleep(0.05)
    assert late.queries == queries, "a cancelled send is still being polled"
    assert torch.equal(as_bytes(decode.kv), as_bytes(before))
    assert [r.block_ids for r in prefill.failures] == [tuple(sorted(SRC))]


def test_a_layer_sent_twice_while_waiting_is_refused(sides) -> None:
    prefill, decode, to_decode = sides
    decode.transport.expect("r", DST, timeout_s=WAIT_S)
    late = LateLayer(prefill.kv, 0, seed=6)
    first = prefill.transport.send("r", SRC, to_decode, DST, [0], WAIT_S, late)
    again = prefill.transport.send("r", SRC, to_decode, DST, [0], WAIT_S)
    with pytest.raises(TransferError, match="already sent"):
        again.wait(WAIT_S)
    late.finish()
    for i in (1, 2):
        prefill.transport.send("r", SRC, to_decode, DST, [i], WAIT_S)
    first.wait(WAIT_S)
    assert decode.transport.wait("r", Role.RECV, WAIT_S).ok


def test_nothing_lands_in_a_reservation_before_its_ready_event(sides) -> None:
    prefill, decode, to_decode = sides
    before = decode.kv.clone()
    ready = Pending()
    decode.transport.expect("r", DST, timeout_s=WAIT_S, ready=ready)
    handles = [prefill.transport.send("r", SRC, to_decode, DST, [i], WAIT_S) for i in range(3)]
    deadline = time.monotonic() + WAIT_S
    while ready.queries < 3:  # the announced layers seen, and held back
        assert time.monotonic() < deadline, "the receiver never looked at its event"
        time.sleep(0.001)
    assert not any(h.done() for h in handles)
    assert torch.equal(as_bytes(decode.kv), as_bytes(before)), "pulled before the event"
    ready.finish()
    assert decode.transport.wait("r", Role.RECV, WAIT_S).ok
    for h in handles:
        h.wait(WAIT_S)
    assert torch.equal(as_bytes(decode.kv[:, DST]), as_bytes(prefill.kv[:, SRC]))


def test_a_reservation_held_by_its_event_fails_at_its_deadline_unwritten(sides) -> None:
    prefill, decode, to_decode = sides
    before = decode.kv.clone()
    ready = Pending()
    decode.transport.expect("r", DST, timeout_s=0.3, ready=ready)
    prefill.transport.send("r", SRC, to_decode, DST, [0, 1, 2], WAIT_S)
    assert not decode.transport.wait("r", Role.RECV, WAIT_S).ok
    assert not prefill.transport.wait("r", Role.SEND, WAIT_S).ok  # told by the Abort
    ready.finish()
    time.sleep(0.05)
    assert torch.equal(as_bytes(decode.kv), as_bytes(before))


class Broken(Pending):
    """A device event whose query fails (a device error)."""

    def query(self) -> bool:
        raise RuntimeError("an illegal memory access was encountered")


def test_a_failing_ready_event_fails_its_reservation_alone(sides) -> None:
    prefill, decode, to_decode = sides
    before = decode.kv.clone()
    decode.transport.expect("r", DST, timeout_s=WAIT_S, ready=Broken())
    prefill.transport.send("r", SRC, to_decode, DST, [0], WAIT_S)
    result = decode.transport.wait("r", Role.RECV, WAIT_S)
    assert not result.ok and "illegal memory access" in (result.error or "")
    assert not prefill.transport.wait("r", Role.SEND, WAIT_S).ok  # told by the Abort
    assert torch.equal(as_bytes(decode.kv), as_bytes(before))
    # The transport goes on: the next reservation lands.
    decode.transport.expect("s", DST, timeout_s=WAIT_S)
    for i in range(3):
        prefill.transport.send("s", SRC, to_decode, DST, [i], WAIT_S)
    assert decode.transport.wait("s", Role.RECV, WAIT_S).ok
