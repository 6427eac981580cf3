"""A worker suspected after a failed call leaves routing at once, and comes back when the
controller still lists it once the suspicion has run out (router/cluster/membership.py),
even if membership never changed meanwhile."""

from __future__ import annotations

import asyncio

from core.roles import WorkerRole
from router.cluster import membership as membership_module
from router.cluster.membership import Membership
from router.routing.route import Router
from tests.router.membership_fakes import Call, Member
from worker.records import WorkerInfo


def _member(worker_id: str, role: WorkerRole) -> Member:
    info = WorkerInfo(worker_id, role, "m", 1000, 16, 64, 512, 1024, "local", b"", 1)
    return Member(worker_id, role, "ready", info)


class _Controller:
    def __init__(self) -> None:
        members = [_member("prefill-0", WorkerRole.PREFILL), _member("decode-1", WorkerRole.DECODE)]
        self.get_members = Call((("a", 1), members))  # the version never changes
        self.get_desired = Call({WorkerRole.PREFILL: 1, WorkerRole.DECODE: 1})


def test_a_live_suspect_rejoins_after_its_suspicion_without_a_membership_change(
    monkeypatch,
) -> None:
    monkeypatch.setattr(membership_module, "_SUSPECT_S", 1.0)
    router = Router()
    membership = Membership(_Controller(), router)

    async def run() -> None:
        await membership.sync()
        assert set(membership.workers) == {"prefill-0", "decode-1"}
        membership.suspect("decode-1")  # a call to it failed
        assert set(membership.workers) == {"prefill-0"} and not membership.is_ready()
        await membership.sync()  # still suspected: stays out
        assert "decode-1" not in membership.workers
        await asyncio.sleep(1.05)
        await membership.sync()  # the controller still lists it as ready: back
        assert set(membership.workers) == {"prefill-0", "decode-1"} and membership.is_ready()

    asyncio.run(run())
    router.close()
