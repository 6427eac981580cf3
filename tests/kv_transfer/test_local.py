"""The protocol end to end over the `local` and `shm` backends (two transports in this
process; `shm` maps its own process's memfd exactly as it would a peer's)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from core.kv_layout import KVLayout
from engine import cpu_kernels
from engine.kv_cache.shared_memory import shared_zeros
from kv_transfer import (
    IncompatiblePeerError,
    Role,
    SendHandle,
    TransferError,
    TransferResult,
    create_transport,
)
from kv_transfer.driver import DriverError

LAYOUT = KVLayout(num_layers=3, num_blocks=12, block_size=4, num_kv_heads=2, head_dim=8)


class Side:
    def __init__(
        self, layout: KVLayout, seed: int, model_id: str = "m", backend: str = "local"
    ) -> None:
        kv = torch.randn(layout.shape, generator=torch.Generator().manual_seed(seed)).half()
        self.kv = shared_zeros(layout.shape, kv.dtype).copy_(kv) if backend == "shm" else kv
        self.failures: list[TransferResult] = []
        self.transport = create_transport(
            self.kv,
            layout,
            model_id,
            backend=backend,
            on_failure=self.failures.append,
            block_copy=cpu_kernels.load("copy_blocks"),
        )


@pytest.fixture(params=["local", "shm"])
def sides(request):
    prefill, decode = Side(LAYOUT, 1, backend=request.param), Side(LAYOUT, 2, backend=request.param)
    to_decode = prefill.transport.add_peer(decode.transport.local_metadata())
    decode.transport.add_peer(prefill.transport.local_metadata())
    yield prefill, decode, to_decode
    prefill.transport.close()
    decode.transport.close()


def test_concurrent_requests_land_exactly(sides) -> None:
    prefill, decode, to_decode = sides
    before = decode.kv.clone()
    plan = {"a": ([5, 0, 7], [11, 2, 3]), "b": ([1, 2], [8, 4])}
    for request_id, (_, dst) in plan.items():
        decode.transport.expect(request_id, dst, timeout_s=10)
    handles = []
    for layer in range(LAYOUT.num_layers):
        for request_id, (src, dst) in plan.items():
            handles.append(prefill.transport.send(request_id, src, to_decode, dst, [layer]))
    for request_id in plan:
        assert decode.transport.wait(request_id, Role.RECV, 10).ok
        assert prefill.transport.wait(request_id, Role.SEND, 10).ok
    for handle in handles:
        handle.wait(1)
    expected = before
    for src, dst in plan.values():
        expected[:, dst] = prefill.kv[:, src]
    assert torch.equal(decode.kv.view(torch.uint8), expected.view(torch.uint8))
    assert decode.failures == prefill.failures == []


def test_deadline_fails_both_sides_and_runs_hooks(sides) -> None:
    prefill, decode, to_decode = sides
    decode.transport.expect("slow", [3, 4], timeout_s=2.0)  # layer 0 lands well before
    prefill.transport.send("slow", [0, 1], to_decode, [3, 4], [0], timeout_s=10)
    result = decode.transport.wait("slow", Role.RECV, 10)
    assert not result.ok and "1/3 layers landed" in (result.error or "")
    sender_result = prefill.transport.wait("slow", Role.SEND, 10)
    assert not sender_result.ok and "aborted" in (sender_result.error or "")
    assert [r.block_ids for r in decode.failures] == [(3, 4)]
    assert [r.block_ids for r in prefill.failures] == [(0, 1)]


def test_blocks_outside_the_reservation_are_refused(sides) -> None:
    prefill, decode, to_decode = sides
    before = decode.kv.clone()
    decode.transport.expect("r", [3, 4], timeout_s=10)
    handle = prefill.transport.send("r", [0, 1], to_decode, [3, 5], [0])
    result = decode.transport.wait("r", Role.RECV, 10)
    assert not result.ok and "not the reservation" in (result.error or "")
    with pytest.raises(TransferError, match="not the reservation"):
        handle.wait(10)
    assert torch.equal(decode.kv.view(torch.uint8), before.view(torch.uint8))


def test_send_without_reservation_is_aborted(sides) -> None:
    prefill, _, to_decode = sides
    prefill.transport.send("nobody", [0], to_decode, [1], [0])
    result = prefill.transport.wait("nobody", Role.SEND, 10)
    assert not result.ok and "no reservation" in (result.error or "")


def test_bad_arguments_raise_in_the_caller(sides) -> None:
    prefill, _, to_decode = sides
    with pytest.raises(ValueError, match="outside"):
        prefill.transport.send("x", [0], to_decode, [12], [0])
    with pytest.raises(ValueError, match="unknown peer"):
        prefill.transport.send("x", [0], "nobody", [1], [0])
    with pytest.raises(ValueError, match="layer 3"):
        prefill.transport.send("x", [0], to_decode, [1], [3])


def test_handshake_refuses_a_different_block_size() -> None:
    ours = Side(LAYOUT, 1)
    other_layout = KVLayout(3, 12, block_size=8, num_kv_heads=2, head_dim=8)
    theirs = Side(other_layout, 2)
    try:
        with pytest.raises(IncompatiblePeerError, match="block_size"):
            ours.transport.add_peer(theirs.transport.local_metadata())
    finally:
        ours.transport.close()
        theirs.transport.close()


def test_hook_runs_on_io_thread_once_per_failure(sides) -> None:
    _prefill, decode, _to_decode = sides
    threads: list[str] = []
    decode.transport._on_failure = lambda r: threads.append(threading.current_thread().name)
    decode.transport.expect("c", [1], timeout_s=10)
    decode.transport.cancel("c")
    assert not decode.transport.wait("c", Role.RECV, 10).ok
    assert len(threads) == 1 and threads[0].startswith("kv-io-")


def test_shm_refuses_a_cache_outside_shared_memory() -> None:
    with pytest.raises(DriverError, match="shared file mapping"):
        create_transport(torch.zeros(LAYOUT.shape, dtype=torch.float16), LAYOUT, "m", backend="shm")


def test_changed_block_lists_are_checked_again(sides) -> None:
    prefill, decode, to_decode = sides
    src, dst = [0, 1], [3, 4]
    decode.transport.expect("m", dst, timeout_s=10)
    prefill.transport.send("m", src, to_decode, dst, [0])
    src[1] = 12  # the same list object, changed after a send that checked it
    with pytest.raises(ValueError, match="source block id 12 outside"):
        prefill.transport.send("m", src, to_decode, dst, [1])
    prefill.transport.send("m", (0, 1), to_decode, (3, 4), [1])  # tuples: converted, checked
    prefill.transport.send("m", [0, 1], to_decode, [3, 4], [2])
    assert decode.transport.wait("m", Role.RECV, 10).ok
    assert prefill.transport.wait("m", Role.SEND, 10).ok


def test_a_reused_request_id_keeps_only_its_own_deadline(sides) -> None:
    prefill, decode, to_decode = sides
    decode.transport.expect("again", [5], timeout_s=0.2)
    decode.transport.cancel("again")
    assert not decode.transport.wait("again", Role.RECV, 10).ok
    decode.transport.expect("again", [5], timeout_s=10)
    time.sleep(0.4)  # the first reservation's deadline passes
    for layer in range(LAYOUT.num_layers):
        prefill.transport.send("again", [2], to_decode, [5], [layer])
    assert decode.transport.wait("again", Role.RECV, 10).ok
    assert torch.equal(decode.kv[:, 5], prefill.kv[:, 2])


def test_shm_without_the_native_copy_lands_the_same_bytes() -> None:
    prefill, decode = Side(LAYOUT, 1, backend="shm"), Side(LAYOUT, 2, backend="shm")
    try:
        decode.transport.driver._native = None  # the per-region memmove fallback
        to_decode = prefill.transport.add_peer(decode.transport.local_metadata())
        decode.transport.add_peer(prefill.transport.local_metadata())
        decode.transport.expect("r", [9, 2, 3], timeout_s=10)
        prefill.transport.send("r", [4, 5, 0], to_decode, [9, 2, 3], [0, 1, 2])
        assert decode.transport.wait("r", Role.RECV, 10).ok
        assert torch.equal(decode.kv[:, [9, 2, 3]], prefill.kv[:, [4, 5, 0]])
    finally:
        prefill.transport.close()
        decode.transport.close()


def test_send_handle_waiters_see_the_outcome() -> None:
    handle = SendHandle("h", [0, 1])
    with pytest.raises(TimeoutError, match="layers \\(0, 1\\) still pending"):
        handle.wait(0.01)
    outcomes: list[str] = []

    def waiter() -> None:
        try:
            handle.wait(10)
            outcomes.append("ok")
        except TransferError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for thread in threads:
        thread.start()
    handle._finish("peer gone")
    handle._finish(None)  # only the first outcome counts
    for thread in threads:
        thread.join(10)
    assert outcomes == ["peer gone"] * 3 and handle.done() and handle.error == "peer gone"


def test_an_idle_transport_naps_longer_and_still_wakes_for_work(sides) -> None:
    """Idle, the I/O thread backs off (it used to wake every 5 ms and take the GIL from
    the engine); a transfer after a long idle spell still starts on its command."""
    prefill, decode, to_decode = sides
    calls = []
    for side in (prefill, decode):
        messages = side.transport.driver.messages
        side.transport.driver.messages = lambda m=messages: calls.append(1) or m()
    time.sleep(1.0)
    # Backing off from 5 ms, a second idle costs each transport at most ~12 steps (at 5 ms
    # naps it was 200); a slow machine only makes it fewer.
    assert len(calls) <= 2 * 15
    decode.transport.expect("late", [3], timeout_s=10)
    prefill.transport.send("late", [1], to_decode, [3], list(range(LAYOUT.num_layers)))
    assert decode.transport.wait("late", Role.RECV, 10).ok
    assert torch.equal(decode.kv[:, 3], prefill.kv[:, 1])


def test_a_transport_waiting_on_its_peer_sleeps_until_a_message_wakes_it() -> None:
    """A reservation held through the sender's queue (a decode worker's, while the prefill
    worker works through the prompts ahead): where messages wake an fd (shm), the I/O thread
    sleeps until one comes instead of polling every 0.2 ms (~5,000 wake-ups a second, each
    preempting an engine thread on a small host); the transfer still lands on its message."""
    prefill, decode = Side(LAYOUT, 1, backend="shm"), Side(LAYOUT, 2, backend="shm")
    try:
        to_decode = prefill.transport.add_peer(decode.transport.local_metadata())
        decode.transport.add_peer(prefill.transport.local_metadata())
        calls = []
        messages = decode.transport.driver.messages
        decode.transport.driver.messages = lambda: calls.append(1) or messages()
        decode.transport.expect("queued", [3, 4], timeout_s=30)
        time.sleep(1.0)
        assert len(calls) <= 20  # polling at 0.2 ms: thousands
        prefill.transport.send("queued", [1, 2], to_decode, [3, 4], list(range(LAYOUT.num_layers)))
        assert decode.transport.wait("queued", Role.RECV, 10).ok
        assert torch.equal(decode.kv[:, 3:5], prefill.kv[:, 1:3])
    finally:
        prefill.transport.close()
        decode.transport.close()


def test_a_waiting_transport_still_fails_a_request_at_its_deadline() -> None:
    """Sleeping on its fds, the I/O thread still wakes for the earliest deadline."""
    prefill, decode = Side(LAYOUT, 1, backend="shm"), Side(LAYOUT, 2, backend="shm")
    try:
        decode.transport.add_peer(prefill.transport.local_metadata())
        decode.transport.expect("never-sent", [3], timeout_s=0.3)
        started = time.monotonic()
        result = decode.transport.wait("never-sent", Role.RECV, 10)
        assert not result.ok and "deadline" in (result.error or "")
        assert time.monotonic() - started < 5  # not the 1 s naps' multiple, nor the wait's 10
    finally:
        prefill.transport.close()
        decode.transport.close()
