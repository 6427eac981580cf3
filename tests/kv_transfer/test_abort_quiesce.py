"""A request's blocks are released (its FAILED result published, so the FailureHook frees
them) only once no pull can touch them any more, whichever side gives up; a reader that
never finishes pins a sender's blocks for a bounded time and then gets its transfer refused.

The receiver's pulls pass a gate (tests/support/gated_driver.py) that holds them on its
I/O thread, where a slow copy or an uncancellable READ would be. "Freeing" is what the
hook does: the test then writes the blocks' next owner's KV into them at once."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from core.kv_layout import KVLayout
from engine.kv_cache.shared_memory import shared_zeros
from kv_transfer import Role, TransferResult
from kv_transfer.transport import DriverTransport
from tests.support.gated_driver import Gate, GatedShmDriver

LAYOUT = KVLayout(num_layers=3, num_blocks=8, block_size=4, num_kv_heads=2, head_dim=8)
SRC, DST = [1, 4], [6, 2]


class Side:
    def __init__(self, seed: int, read_lease_s: float | None = None) -> None:
        kv = torch.randn(LAYOUT.shape, generator=torch.Generator().manual_seed(seed)).half()
        self.kv = shared_zeros(LAYOUT.shape, kv.dtype).copy_(kv)
        self.freed: list[TransferResult] = []
        self.freed_event = threading.Event()
        self.transport = DriverTransport(
            lambda name: GatedShmDriver(self.kv, LAYOUT, name),
            LAYOUT,
            "m",
            on_failure=self._free,
            read_lease_s=read_lease_s,
        )
        self.gate: Gate = self.transport.driver.gate  # type: ignore[attr-defined]
        self.pulls_when_freed: int | None = None
        self.peer_gate: Gate | None = None

    def _free(self, result: TransferResult) -> None:
        """The FailureHook: records whether the peer's pulls were still in flight."""
        if self.peer_gate is not None:
            self.pulls_when_freed = self.peer_gate.num_in_flight
        self.freed.append(result)
        self.freed_event.set()

    def next_owner_writes(self, block_ids: list[int], seed: int) -> torch.Tensor:
        new = torch.randn(
            self.kv[:, block_ids].shape, generator=torch.Generator().manual_seed(seed)
        )
        self.kv[:, block_ids] = new.half()
        return self.kv[:, block_ids].clone()


def pair(lease_s: float | None = None) -> tuple[Side, Side, str]:
    prefill, decode = Side(1, lease_s), Side(2, lease_s)
    prefill.peer_gate = decode.gate
    to_decode = prefill.transport.add_peer(decode.transport.local_metadata())
    decode.transport.add_peer(prefill.transport.local_metadata())
    return prefill, decode, to_decode


@pytest.fixture
def sides():
    made: list[Side] = []

    def make(lease_s: float | None = None) -> tuple[Side, Side, str]:
        prefill, decode, to_decode = pair(lease_s)
        made.extend([prefill, decode])
        return prefill, decode, to_decode

    yield make
    for side in made:
        side.gate.open()
        side.transport.close()


def start_held_pull(prefill: Side, decode: Side, to_decode: str) -> torch.Tensor:
    """Offer every layer; the receiver's first pull is held at its gate. Returns the KV
    the receiver must end with if it reports success."""
    decode.transport.expect("r", DST, timeout_s=30)
    decode.gate.close()
    for layer in range(LAYOUT.num_layers):
        prefill.transport.send("r", SRC, to_decode, DST, [layer], timeout_s=30)
    assert decode.gate.holding.wait(10), "the pull never reached the gate"
    return prefill.kv[:, SRC].clone()


def test_receiver_abort_ends_the_request_only_after_the_held_pull(sides) -> None:
    prefill, decode, to_decode = sides()
    start_held_pull(prefill, decode, to_decode)
    decode.transport.cancel("r")
    with pytest.raises(TimeoutError):  # no result (ok or failed) while a pull writes
        decode.transport.wait("r", Role.RECV, 0.3)
    decode.gate.open()
    decode.transport.wait("r", Role.RECV, 10)  # the worker frees the reservation on this
    assert decode.gate.num_in_flight == 0
    owner = decode.next_owner_writes(DST, seed=7)  # the blocks' next owner
    prefill.transport.wait("r", Role.SEND, 10)
    assert torch.equal(decode.kv[:, DST].view(torch.uint8), owner.view(torch.uint8))


def test_sender_abort_holds_source_blocks_until_the_reader_stopped(sides) -> None:
    prefill, decode, to_decode = sides()
    sent = start_held_pull(prefill, decode, to_decode)
    prefill.transport.cancel("r")
    assert not prefill.freed_event.wait(0.3), "source blocks freed while a reader copies them"
    decode.gate.open()
    assert prefill.freed_event.wait(10)
    assert prefill.pulls_when_freed == 0
    prefill.next_owner_writes(SRC, seed=7)
    result = decode.transport.wait("r", Role.RECV, 10)
    if result.ok:  # every pull ended before the blocks were reused: the KV is the sent KV
        assert torch.equal(decode.kv[:, DST].view(torch.uint8), sent.view(torch.uint8))


def test_a_stuck_reader_pins_source_blocks_only_until_the_hold_ends(sides) -> None:
    lease_s = 0.2  # the sender holds twice that
    prefill, decode, to_decode = sides(lease_s)
    start_held_pull(prefill, decode, to_decode)
    start = time.monotonic()
    prefill.transport.cancel("r")
    assert prefill.freed_event.wait(10), "a stuck reader pinned the source blocks"
    assert time.monotonic() - start >= 2 * lease_s - 0.05
    assert prefill.pulls_when_freed == 1  # still stuck: freed on the deadline alone
    prefill.next_owner_writes(SRC, seed=7)
    decode.gate.open()  # the late pull now copies the next owner's KV ...
    result = decode.transport.wait("r", Role.RECV, 10)
    assert not result.ok  # ... and is refused, never reported as this request's KV
    assert "lease" in (result.error or "")


def test_a_pull_slower_than_its_lease_is_refused(sides) -> None:
    prefill, decode, to_decode = sides(0.1)
    start_held_pull(prefill, decode, to_decode)
    time.sleep(0.3)
    decode.gate.open()
    result = decode.transport.wait("r", Role.RECV, 10)
    assert not result.ok and "lease" in (result.error or "")
    assert not prefill.transport.wait("r", Role.SEND, 10).ok


def test_a_peer_on_another_host_is_unreachable_for_good() -> None:
    """The shm backend maps a peer's cache on this host only: a peer elsewhere is an
    UnpairableError (the controller refuses the pool), not a failure worth a new worker."""
    import msgspec

    from core.preflight import UnpairableError
    from kv_transfer.shm_driver import ShmDriver

    driver = ShmDriver(shared_zeros(LAYOUT.shape, torch.float16), LAYOUT, "here")
    _, *rest = msgspec.msgpack.decode(driver.metadata())
    elsewhere = msgspec.msgpack.encode(("another-boot-id", *rest))
    try:
        with pytest.raises(UnpairableError, match="another host"):
            driver.connect("there", elsewhere)
    finally:
        driver.close()
