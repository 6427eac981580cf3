"""Two (or three) real processes per backend and UCX transport: byte-exact per-layer
transfers of scattered blocks with several requests in flight, and peer death on either
side. Process start dominates the run time, so the shared-memory cases reuse one sender
and two receivers across the tests of `TestSharedMemory` (they run in file order; the
sender is killed last)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from kv_transfer import unavailable_reason
from tests.kv_transfer.peer_process import Peer, make_cache

SPEC = dict(num_layers=4, num_blocks=24, block_size=4, num_kv_heads=2, head_dim=16, dtype="float16")
SENDER_SEED, RECEIVER_SEED = 1, 2
DEADLINE_S = 2.0


def _start(backend: str, tls: str, num_receivers: int) -> tuple[Peer, list[Peer], list[str]]:
    """A sender and its receivers, connected both ways; the receivers' ids as the sender
    names them. Each receiver calls the sender `SENDER` (see `expect`)."""
    reason = unavailable_reason("nixl" if backend == "auto" else backend)
    if reason is not None:
        pytest.skip(reason)
    sender = Peer(backend, tls, SPEC, SENDER_SEED)
    receivers = [Peer(backend, tls, SPEC, RECEIVER_SEED) for _ in range(num_receivers)]
    peer_ids = []
    for receiver in receivers:
        peer_ids.append(sender.call("add_peer", receiver.metadata))
        assert receiver.call("add_peer", sender.metadata) == sender.name
    return sender, receivers, peer_ids


def expect(receiver: Peer, request_id: str, dst: list[int], timeout_s: float, sender: Peer) -> None:
    """Reserve `dst` for `request_id`, to be filled by `sender` only."""
    receiver.call("expect", request_id, dst, None, timeout_s, sender.name)


def _plan(num_requests: int, blocks_per_request: int) -> list[tuple[str, list[int], list[int]]]:
    """Requests with scattered, disjoint source and destination blocks (some runs merge)."""
    rng = random.Random(7)
    num_blocks = SPEC["num_blocks"]
    # Scattered ids, plus one run that merges into a single region on both sides.
    src_pool = [0, 1, 2, *rng.sample(range(3, num_blocks), num_blocks - 3)]
    others = [b for b in range(num_blocks) if b not in (10, 11, 12)]
    dst_pool = [10, 11, 12, *rng.sample(others, len(others))]
    return [
        (
            f"req-{i}",
            src_pool[i * blocks_per_request : (i + 1) * blocks_per_request],
            dst_pool[i * blocks_per_request : (i + 1) * blocks_per_request],
        )
        for i in range(num_requests)
    ]


def check_byte_exact_transfer(sender: Peer, receiver: Peer, to_receiver: str) -> None:
    plan = _plan(num_requests=3, blocks_per_request=5)
    for request_id, _, dst in plan:
        expect(receiver, request_id, dst, 20.0, sender)
    for layer in range(SPEC["num_layers"]):  # per-layer sends, requests interleaved
        for request_id, src, dst in plan:
            sender.call("send", request_id, src, to_receiver, dst, [layer], 20.0)
    for request_id, _, _ in plan:
        assert receiver.call("wait", request_id, "recv", 20.0)["ok"]
        assert sender.call("wait", request_id, "send", 20.0)["ok"]

    _, src_kv = make_cache(SPEC, SENDER_SEED)
    _, expected = make_cache(SPEC, RECEIVER_SEED)
    for _, src, dst in plan:
        expected[:, dst] = src_kv[:, src]
    got = receiver.call("cache")
    assert np.array_equal(got, expected.view(torch.uint8).numpy())  # and nothing else changed
    assert receiver.call("failures") == [] and sender.call("failures") == []


@pytest.mark.parametrize("backend", ["nixl", "ucx"])
def test_tcp_transfer_is_byte_exact(backend: str) -> None:
    sender, receivers, peer_ids = _start(backend, "tcp", num_receivers=1)
    try:
        check_byte_exact_transfer(sender, receivers[0], peer_ids[0])
    finally:
        for peer in [sender, *receivers]:
            peer.stop()


@pytest.fixture(scope="class", params=["nixl", "ucx", "shm", "auto"])
def trio(request):
    sender, receivers, peer_ids = _start(request.param, "shm", num_receivers=2)
    yield sender, receivers, peer_ids
    for peer in [sender, *receivers]:
        peer.stop()


class TestSharedMemory:
    def test_transfer_is_byte_exact(self, trio) -> None:
        sender, receivers, peer_ids = trio
        check_byte_exact_transfer(sender, receivers[0], peer_ids[0])
        if sender.backend == "auto":  # peers on one host: shm, with NIXL loaded beside it
            assert set(sender.call("peer_backends").values()) == {"shm"}

    def test_receiver_death_fails_sender(self, trio) -> None:
        sender, receivers, peer_ids = trio
        src, dst = [1, 2, 3], [7, 11, 13]
        expect(receivers[1], "doomed-recv", dst, DEADLINE_S, sender)
        sender.call("send", "doomed-recv", src, peer_ids[1], dst, [0], DEADLINE_S)
        sender.call("wait_handle", "doomed-recv", [0], 10.0)
        receivers[1].kill()
        sender.call("send", "doomed-recv", src, peer_ids[1], dst, [1], DEADLINE_S)
        result = sender.call("wait", "doomed-recv", "send", 15.0)
        assert not result["ok"] and result["error"]
        failures = sender.call("failures")
        assert [(f["request_id"], sorted(f["block_ids"])) for f in failures] == [
            ("doomed-recv", src)
        ]

    def test_sender_death_fails_receiver_and_frees_blocks(self, trio) -> None:
        sender, receivers, peer_ids = trio
        src, dst = [3, 9, 10], [20, 4, 5]
        expect(receivers[0], "doomed-send", dst, DEADLINE_S, sender)
        for layer in (0, 1):
            sender.call("send", "doomed-send", src, peer_ids[0], dst, [layer], DEADLINE_S)
            sender.call("wait_handle", "doomed-send", [layer], 10.0)
        sender.kill()
        result = receivers[0].call("wait", "doomed-send", "recv", 15.0)
        assert not result["ok"] and "2/4 layers landed" in result["error"]
        failures = receivers[0].call("failures")
        assert [(f["request_id"], list(f["block_ids"])) for f in failures] == [("doomed-send", dst)]
