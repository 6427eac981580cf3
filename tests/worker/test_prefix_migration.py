"""Prefix migration between prefill workers: p1 copies a prefix p0 caches over the KV
transport (p1 reserves, p0 "prefills" the prefix into p1's blocks, p1 caches them), and a
prompt on p1 then hits them: the copied KV is p0's byte for byte, the prompt computes only
what follows, and its tokens are those of the same prompt prefilled on p0.

Real workers (tiny model, tp=1, shm transport) in this process."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from core.errors import WorkerFailedError
from core.hashing import hash_prompt_blocks
from core.request import EngineRequest
from core.roles import WorkerRole
from core.sampling import SamplingParams
from decode_worker.worker import DecodeWorker
from prefill_worker.worker import PrefillWorker
from tests.support.worker_pair import (
    BLOCK,
    TIMEOUT_S,
    cached_kv,
    connect_pair,
    handoff,
    on_engine,
    request,
    same,
    settled,
    spec,
)

NUM_BLOCKS = 16


@pytest.fixture
def trio(tiny_model_dir, loop_thread):
    model = tiny_model_dir()
    p0 = PrefillWorker(spec("p0", WorkerRole.PREFILL, model, NUM_BLOCKS, "shm"))
    p1 = PrefillWorker(spec("p1", WorkerRole.PREFILL, model, NUM_BLOCKS, "shm"))
    d0 = DecodeWorker(spec("d0", WorkerRole.DECODE, model, NUM_BLOCKS, "shm"))
    for prefill in (p0, p1):
        loop_thread.run(connect_pair(prefill, d0))
    loop_thread.run(p0.connect(p1.info().transport_metadata))
    loop_thread.run(p1.connect(p0.info().transport_metadata))
    yield p0, p1, d0
    for w in (p0, p1, d0):
        w.shutdown()


async def disaggregated(prefill: Any, decode: Any, req: EngineRequest) -> tuple[Any, list[int]]:
    """Prefill on `prefill`, decode on `decode`: (the prefill reply, every output token)."""
    _, reply, tokens = await handoff(prefill, decode, req)
    return reply, tokens


def test_a_prefix_pulled_from_a_peer_is_its_kv_and_is_hit(trio, loop_thread) -> None:
    p0, p1, d0 = trio
    first = request("a", seed=21, max_tokens=6)
    num_full = len(first.prompt_token_ids) // BLOCK

    async def scenario() -> None:
        _, expected = await disaggregated(p0, d0, first)
        await settled(p0)
        on_p0 = await on_engine(p0, cached_kv)
        assert len(on_p0) == num_full
        # d0 forgets the prompt, so the second request's KV really comes from p1.
        await settled(d0)
        assert await on_engine(d0, lambda r: r.engine.kv.pool.reset_prefix_cache())

        prefix = EngineRequest(
            "a.prefix",
            first.prompt_token_ids[: num_full * BLOCK],
            SamplingParams(max_tokens=1, temperature=0.0),
        )
        res = await p1.reserve(prefix, TIMEOUT_S, p0.worker_id)
        assert res.num_cached_tokens == 0
        await p0.prefill(prefix, p1.worker_id, res.dst_block_ids, 0, TIMEOUT_S, hand_over=True)
        assert await p1.import_prefix(prefix.request_id, TIMEOUT_S) == num_full
        await settled(p0)
        await settled(p1)
        on_p1 = await on_engine(p1, cached_kv)
        assert on_p1.keys() == on_p0.keys()
        assert same(on_p0, on_p1, on_p0), "the pulled blocks are not p0's KV"
        # p0 handed the prefix over: its copy is the first it evicts, tail first (all but
        # the last block, which p0 computed again for the prompt's last token: a duplicate of
        # the cached one, freed at once)
        order, chain = await on_engine(p0, lambda r: (
            r.engine.kv.pool.eviction_order(),
            hash_prompt_blocks(prefix.prompt_token_ids, BLOCK, r.engine.root_hash),
        ))  # fmt: skip
        assert order[: num_full - 1] == chain[-2::-1]

        second = replace(first, request_id="b")
        reply, tokens = await disaggregated(p1, d0, second)
        assert reply.num_cached_tokens == num_full * BLOCK
        assert tokens == expected

    loop_thread.run(scenario())


def test_a_failed_pull_frees_the_reservation(trio, loop_thread) -> None:
    p0, p1, _ = trio
    prefix = EngineRequest(
        "x.prefix", request("x", seed=5).prompt_token_ids[: 2 * BLOCK], SamplingParams()
    )

    async def scenario() -> None:
        await p1.reserve(prefix, 0.2, p0.worker_id)  # nobody sends: the deadline passes
        with pytest.raises(WorkerFailedError, match=r"x\.prefix"):
            await p1.import_prefix(prefix.request_id, TIMEOUT_S)
        await settled(p1)
        assert await on_engine(p1, lambda r: r.engine.kv.pool.num_cached_blocks) == 0

    loop_thread.run(scenario())
