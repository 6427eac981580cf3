"""The backend chosen per peer (kv_transfer.paired): shm on this host, a network backend for
peers on others, a clear error where there is none; and `require_network` failing at start.

In this process the network backends are made unavailable (loading NIXL here would clash
with the UCX wheel the two-process tests load); the multi-host tests run NIXL for real."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import torch

from core.kv_layout import KVLayout
from engine import cpu_kernels
from engine.kv_cache.shared_memory import shared_zeros
from kv_transfer import IncompatiblePeerError, Role, create_transport, registry
from kv_transfer.paired import PairedInfo, PairedTransport, peer_compat

LAYOUT = KVLayout(num_layers=2, num_blocks=8, block_size=4, num_kv_heads=2, head_dim=8)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    reasons = {"nixl": "nixl is not loaded in this test", "ucx": "ucx is not loaded either"}
    real = registry.unavailable_reason
    monkeypatch.setattr(registry, "unavailable_reason", lambda n: reasons.get(n) or real(n))


def cache(seed: int) -> torch.Tensor:
    kv = torch.randn(LAYOUT.shape, generator=torch.Generator().manual_seed(seed)).half()
    return shared_zeros(LAYOUT.shape, kv.dtype).copy_(kv)


def auto(kv: torch.Tensor, name: str) -> PairedTransport:
    t = create_transport(kv, LAYOUT, "m", name=name, block_copy=cpu_kernels.load("copy_blocks"))
    assert isinstance(t, PairedTransport)
    return t


def test_peers_on_this_host_move_kv_over_shm(no_network) -> None:
    src_kv, dst_kv = cache(1), cache(2)
    prefill, decode = auto(src_kv, "p0"), auto(dst_kv, "d0")
    try:
        to_decode = prefill.add_peer(decode.local_metadata())
        to_prefill = decode.add_peer(prefill.local_metadata())
        assert prefill.peer_backends == {"d0": "shm"} and decode.peer_backends == {"p0": "shm"}
        decode.expect("r", [5, 6], timeout_s=10, peer=to_prefill)
        for layer in range(LAYOUT.num_layers):
            prefill.send("r", [0, 1], to_decode, [5, 6], [layer])
        assert decode.wait("r", Role.RECV, 10).ok and prefill.wait("r", Role.SEND, 10).ok
        assert torch.equal(dst_kv[:, [5, 6]], src_kv[:, [0, 1]])
    finally:
        prefill.close()
        decode.close()


def test_only_the_named_peer_may_fill_a_reservation(no_network) -> None:
    prefill, other, decode = auto(cache(1), "p0"), auto(cache(3), "p1"), auto(cache(2), "d0")
    try:
        for sender in (prefill, other):
            sender.add_peer(decode.local_metadata())
            decode.add_peer(sender.local_metadata())
        decode.expect("r", [5], timeout_s=10, peer="p0")
        other.send("r", [0], "d0", [5], [0])
        result = decode.wait("r", Role.RECV, 10)
        assert not result.ok and "bound to peer p0" in (result.error or "")
    finally:
        for t in (prefill, other, decode):
            t.close()


def test_a_peer_on_another_host_needs_a_network_backend(no_network) -> None:
    ours, theirs = auto(cache(1), "a"), auto(cache(2), "b")
    try:
        info = msgspec.msgpack.decode(theirs.local_metadata(), type=PairedInfo)
        elsewhere = msgspec.msgpack.encode(msgspec.structs.replace(info, host="another-host"))
        with pytest.raises(IncompatiblePeerError, match=r"another host.*nixl is not loaded"):
            ours.add_peer(elsewhere)
        assert ours.peer_backends == {}
    finally:
        ours.close()
        theirs.close()


def test_a_multi_host_worker_without_a_network_backend_fails_at_start(no_network) -> None:
    with pytest.raises(RuntimeError, match=r"nixl: nixl is not loaded.*ucx: ucx is not loaded"):
        create_transport(cache(1), LAYOUT, "m", require_network=True)


def _standing_for(backend: str) -> Any:
    """A transport standing for one backend in the choice (never asked to move anything)."""
    return SimpleNamespace(name="t", backend=backend, local_metadata=lambda: b"")


@pytest.mark.parametrize(
    "ours,theirs,same_host,chosen",
    [
        # GPU caches on one host: CUDA IPC where neither side has a network backend ...
        (["cuda_ipc"], ["cuda_ipc"], True, "cuda_ipc"),
        # ... and the network backend where both have one (NIXL moves VRAM on a host too).
        (["cuda_ipc", "nixl"], ["cuda_ipc", "nixl"], True, "nixl"),
        (["cuda_ipc"], ["cuda_ipc"], False, None),  # CUDA IPC does not cross hosts
        (["shm", "ucx"], ["shm", "ucx"], True, "shm"),
    ],
)
def test_the_backend_chosen_per_peer(ours, theirs, same_host, chosen) -> None:
    paired = PairedTransport({name: _standing_for(name) for name in ours})
    host = paired.host if same_host else "another-host"
    if chosen is None:
        with pytest.raises(IncompatiblePeerError, match="another host"):
            paired.backend_for(host, theirs)
    else:
        assert paired.backend_for(host, theirs) == chosen


def test_the_cuda_ipc_backend_takes_gpu_caches_only() -> None:
    from kv_transfer.cuda_ipc_driver import CudaIpcDriver

    with pytest.raises(ValueError, match="GPU memory only; use shm"):
        CudaIpcDriver(cache(1), LAYOUT, "a")


def test_a_worker_without_any_backend_serves_and_refuses_peers(no_network) -> None:
    # A CPU cache not in shared memory stands for a GPU whose IPC the sandbox lacks: no
    # backend starts. The worker still starts (a unified worker moves no KV); a peer, and a
    # reservation, are refused naming why each backend is missing.
    lone = create_transport(torch.zeros(LAYOUT.shape).half(), LAYOUT, "m", name="lone")
    ours = auto(cache(1), "p0")
    try:
        assert isinstance(lone, PairedTransport) and lone.backend == "none"
        assert lone.name == "lone" and lone.poll() == []
        with pytest.raises(IncompatiblePeerError, match=r"shm: .*nixl is not loaded"):
            lone.add_peer(ours.local_metadata())
        with pytest.raises(IncompatiblePeerError, match="the peer moves no KV"):
            peer_compat(lone.local_metadata())
        with pytest.raises(
            ValueError, match=r"no KV transport here \(.*shm: the shm backend needs"
        ):
            lone.expect("r", [1], timeout_s=1)
    finally:
        lone.close()
        ours.close()
