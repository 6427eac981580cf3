"""The router hashes prompts with the block size of the pool they run on first: a decode pool
of another block size (worker/landing.py) does not decide it, whichever pool joins first
(router/cluster/membership.py); its free blocks count in the router's blocks, and its cached
prefixes are found by hashes of its own block size (router/routing/models.py)."""

from __future__ import annotations

import asyncio

from core.events import BlockStored, KVEventBatch, WorkerLoad
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
        assert router.models.get("m").decode_block_size == 32
        # 10 free blocks of 32 tokens are 20 of the 16 the router counts by.
        router.report_load(WorkerLoad(members[order.index(WorkerRole.DECODE)].worker_id,
                                      "decode", 0, 0, 0, 10, 64))  # fmt: skip
        decode = router._loads.workers[f"{WorkerRole.DECODE}-{order.index(WorkerRole.DECODE)}"]
        assert (decode.free_blocks, decode.total_blocks) == (20, 128)
        router.close()


def test_a_decode_pool_of_another_block_size_is_found_by_its_own_hashes() -> None:
    """Decode workers report blocks of 32 tokens; the router, hashing by the prefill pool's
    16, finds their cached prefixes by the prompt's 32-token hashes and counts them in its
    own blocks: the decode worker holding the prompt is chosen and its prefix counted."""
    router = Router()
    router.register_model("m", 16)
    router.models.set_decode_block_size("m", 32)
    for worker, role in (("p0", "prefill"), ("d0", "decode"), ("d1", "decode")):
        router.add_worker(worker, role, "m", 32 if role == "decode" else 16)
        router.report_load(WorkerLoad(worker, role, 0, 0, 0, 32, 64))
    tokens = list(range(3, 203))  # 12 blocks of 16, 6 of 32
    held = hash_prompt_blocks(tokens[:128], 32, model_root_hash("m", 32))  # 4 of 32 tokens
    router.apply(KVEventBatch("d1", 0, [BlockStored(None, held)], model="m"))
    hashes = router.hash_blocks("m", tokens)
    decode_hashes = router.hash_blocks("m", tokens, decode=True)
    assert (
        decode_hashes[:4] == held and router.hash_blocks("m", tokens[:40], decode=True) == held[:1]
    )
    with router.route(
        "m", block_hashes=hashes, num_prompt_tokens=len(tokens), decode_block_hashes=decode_hashes
    ) as ticket:
        assert ticket.decision.decode_worker_id == "d1"
        assert ticket.decision.decode_cached_blocks == 8  # 4 of 32 = 8 of 16
    # The same with the prompt's tokens: the router hashes both sizes itself.
    with router.route("m", tokens) as ticket:
        assert (ticket.decision.decode_worker_id, ticket.decision.decode_cached_blocks) == ("d1", 8)
    router.close()
