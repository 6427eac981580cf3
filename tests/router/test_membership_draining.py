"""A draining worker leaves routing at once but is not *gone* until the controller drops it:
its output channel (an `on_left` callback) stays open meanwhile, so the streams it runs end
on it (router/cluster/membership.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from core.roles import WorkerRole
from router.cluster.membership import Membership
from router.routing.route import Router
from tests.router.membership_fakes import Call, Member
from worker.records import WorkerInfo


def _member(worker_id: str, role: WorkerRole) -> Member:
    info = WorkerInfo(worker_id, role, "m", 1000, 16, 64, 512, 1024, "local", b"", 1)
    return Member(worker_id, role, "ready", info)


def test_a_draining_worker_leaves_routing_and_is_gone_only_once_dropped() -> None:
    prefill, decode = (
        _member("prefill-0", WorkerRole.PREFILL),
        _member("decode-1", WorkerRole.DECODE),
    )
    extra = _member("decode-2", WorkerRole.DECODE)
    controller = type("Controller", (), {})()
    controller.get_desired = Call({WorkerRole.PREFILL: 1, WorkerRole.DECODE: 1})
    router = Router()
    membership = Membership(controller, router)
    draining: list[str] = []
    left: list[str] = []
    membership.on_draining.append(draining.append)
    membership.on_left.append(left.append)

    async def sync(version: int, members: list[Member]) -> None:
        controller.get_members = Call((("a", version), members))
        await membership.sync()

    async def run() -> None:
        await sync(1, [prefill, decode, extra])
        assert set(membership.workers) == {"prefill-0", "decode-1", "decode-2"}
        await sync(2, [prefill, decode, replace(extra, state="draining")])
        assert set(membership.workers) == {"prefill-0", "decode-1"}  # no longer routed to
        assert draining == ["decode-2"] and left == []  # its channel stays open
        await sync(3, [prefill, decode])  # drained and stopped
        assert draining == ["decode-2"] and left == ["decode-2"]
        await sync(4, [prefill])  # a ready worker that vanishes is gone at once
        assert left == ["decode-2", "decode-1"] and draining == ["decode-2"]

    asyncio.run(run())
    router.close()
