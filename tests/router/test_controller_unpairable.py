"""A worker that cannot move KV with a peer already up, for a reason no retry changes (their
transports share no backend: kv_transfer's IncompatiblePeerError), refuses its pool at once,
as a preflight mismatch does, rather than the controller starting worker after worker until
the cluster's start times out. The controller's own start path, with the launch and the
pairing calls standing in for Ray's."""

from __future__ import annotations

import asyncio
import pickle
from types import SimpleNamespace

import pytest

from core.preflight import UnpairableError
from core.roles import WorkerRole
from kv_transfer import IncompatiblePeerError
from kv_transfer.driver import UnreachablePeerError
from router.cluster import controller as controller_module
from router.cluster import launch
from router.cluster.controller import Controller, Member
from router.cluster.spec import ClusterSpec


def _handle() -> SimpleNamespace:
    async def info() -> SimpleNamespace:
        return SimpleNamespace(facts=None, pid=1, transport_backend="none", num_kv_blocks=8,
                               transport_metadata=b"")  # fmt: skip

    return SimpleNamespace(info=SimpleNamespace(remote=info))


@pytest.mark.parametrize(
    "failure,refused",
    [
        (IncompatiblePeerError("transport (a peer on this host)", "[] (cuda_ipc: no IPC)", "[]"),
         True),
        (UnreachablePeerError("cannot open peer p's KV cache: cuda_ipc: no IPC"), True),
        (RuntimeError("the peer's call timed out"), False),  # may pass: started again
    ],
)  # fmt: skip
def test_a_pair_that_cannot_move_kv_refuses_the_pool(monkeypatch, failure, refused) -> None:
    async def launch_worker(spec, pool, worker_id, actor_name) -> SimpleNamespace:
        return SimpleNamespace(handle=_handle(), placement=None, asked="a GPU")

    async def pair_workers(a, b) -> None:
        raise failure

    monkeypatch.setattr(launch, "launch_worker", launch_worker)
    monkeypatch.setattr(controller_module, "pair_workers", pair_workers)
    controller = Controller(ClusterSpec(model_dir="/models/m"))
    decode = Member("decode-0", WorkerRole.DECODE, "ready", _handle(), SimpleNamespace(facts=None))
    controller.members[decode.worker_id] = decode
    asyncio.run(controller._start_worker(WorkerRole.PREFILL))
    assert [m.worker_id for m in controller.members.values()] == ["decode-0"]  # stopped
    assert str(failure) in controller.last_start_failure
    assert (WorkerRole.PREFILL in controller.refused) == refused
    if refused:
        assert "cuda_ipc: no IPC" in controller.refused[WorkerRole.PREFILL]


@pytest.mark.parametrize(
    "error",
    [IncompatiblePeerError("backend", "cuda_ipc", "shm"), UnreachablePeerError("not visible")],
)
def test_an_unpairable_error_keeps_its_kind_on_its_way_from_a_worker(error) -> None:
    """Raised in a worker's pairing call, the error reaches the controller pickled (Ray's
    way with an actor's exception): it must come back an UnpairableError, with its message,
    for the controller to refuse the pool."""
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and isinstance(back, UnpairableError)
    assert str(back) == str(error)
