"""The router hashes prompts with the block size of the pool they run on first: a decode pool
of another block size (worker/landing.py) does not decide it, whichever pool joins first
(router/cluster/membership.py), and its free blocks count in the router's blocks."""

from __future__ import annotations

import asyncio

from core.events import WorkerLoad
from core.hashing import hash_prompt_blocks, model_root_hash
from core.roles import WorkerRole
from router.cluster.membership import Membership
from router.routing.route import Router
from tests.router.membership_fakes import Call, Member
from worker.records import WorkerInfo


def _member(worker_id: str, role: WorkerRole, block_size: int) -> Member:
    info = WorkerInfo(worker_id, role, "m", 1000, block_size, 64, 512, 1024, "local", b"", 1)
    return Member(worker_id, role, "ready", info)


def test_the_prefill_pools_block_size_hashes_prompts() -> None:
    tokens = list(range(100))
    for order in ((WorkerRole.DECODE, WorkerRole.PREFILL), (WorkerRole.PREFILL, WorkerRole.DECODE)):
        controller = type("Controller", (), {})()
        controller.get_desired = Call({WorkerRole.PREFILL: 1, WorkerRole.DECODE: 1})
        router = Router()
        membership = Membership(controller, router)
        sizes = {WorkerRole.PREFILL: 16, WorkerRole.DECODE: 32}
        members = [_member(f"{role}-{i}", role, sizes[role]) for i, role in enumerate(order)]

        async def run(membership=membership, controller=controller, members=members) -> None:
            for version in (1, 2):  # one worker, then both
                controller.get_members = Call((("a", version), members[:version]))
                await membership.sync()

        asyncio.run(run())
        want = hash_prompt_blocks(tokens, 16, model_root_hash("m", 16))
        assert router.hash_blocks("m", tokens) == want, order
        assert membership.model.block_size == 16
        # 10 free blocks of 32 tokens are 20 of the 16 the router counts by.
        router.report_load(WorkerLoad(members[order.index(WorkerRole.DECODE)].worker_id,
                                      "decode", 0, 0, 0, 10, 64))  # fmt: skip
        decode = router._loads.workers[f"{WorkerRole.DECODE}-{order.index(WorkerRole.DECODE)}"]
        assert (decode.free_blocks, decode.total_blocks) == (20, 128)
        router.close()
