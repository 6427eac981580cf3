"""A decode worker whose cache is laid out otherwise than its prefill worker's (block 32 and an
int8 cache against block 16 and float32; real engines, shm transport, this process):

- the prompt's KV lands in the area of the prefill's layout, is rewritten into the decode
  worker's blocks, and decoding goes on from it as one process that prefills with a float32
  cache and decodes with an int8 one (tests/support/handoff.py);
- a prompt sent again skips the blocks the decode worker caches, counted in the prefill
  worker's blocks; the decode worker names its blocks by hashes of its own block size, not
  the router's (made by the prefill pool's);
- an area that is full refuses a reservation as a full cache does, and every staged block is
  free again once its request ended, aborted or timed out."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

import pytest

from core.config import EngineConfig
from core.errors import KVCapacityError, WorkerFailedError
from core.hashing import hash_prompt_blocks, model_root_hash
from core.kv_layout import landing_bytes
from core.request import EngineRequest
from core.roles import WorkerRole
from core.sampling import SamplingParams
from decode_worker.worker import DecodeWorker
from engine.engine import LLMEngine
from prefill_worker.worker import PrefillWorker
from tests.support import worker_pair
from tests.support.handoff import ParkingConnector, run_disaggregated
from tests.support.worker_pair import connect_pair, on_engine, settled
from worker.records import WorkerSpec

TIMEOUT_S = 30.0
PREFILL = EngineConfig(num_kv_blocks=64, max_model_len=128, max_num_batched_tokens=64)
DECODE = replace(PREFILL, block_size=32, num_kv_blocks=32, kv_cache_dtype="int8")
AREA_BLOCKS = (128 + 64) // 16
"""The decode worker's area for the prefill's layout: max_model_len + a step's tokens."""


def request(request_id: str, num_tokens: int, seed: int, max_tokens: int = 6) -> EngineRequest:
    rng = random.Random(seed)
    prompt = [rng.randrange(3, 500) for _ in range(num_tokens)]
    return EngineRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0))


@pytest.fixture
def workers(tiny_model_dir, loop_thread):
    model = str(tiny_model_dir())
    prefill = PrefillWorker(WorkerSpec("p0", WorkerRole.PREFILL, model, PREFILL, transport="shm"))
    decode = DecodeWorker(WorkerSpec("d0", WorkerRole.DECODE, model, DECODE, transport="shm"))
    loop_thread.run(connect_pair(prefill, decode))
    yield prefill, decode
    for worker in (prefill, decode):
        worker.shutdown()


def staged(decode: DecodeWorker) -> Any:
    return on_engine(decode, lambda r: r.landings.num_staged())


async def handoff(prefill: PrefillWorker, decode: DecodeWorker, req: EngineRequest) -> tuple:
    """(blocks skipped, every output token) of `req` prefilled on `prefill`, decoded on
    `decode`."""
    res, _, tokens = await worker_pair.handoff(prefill, decode, req)
    return res.skip_blocks, tokens


def test_unlike_kv_lands_and_decodes_as_one_process(workers, loop_thread, tiny_model_dir) -> None:
    prefill, decode = workers
    reference_prefill = LLMEngine(tiny_model_dir(), replace(DECODE, kv_cache_dtype="auto"))
    ParkingConnector(reference_prefill)
    reference_decode = LLMEngine(tiny_model_dir(), DECODE)
    batch = [request(f"r{i}", n, seed=i) for i, n in enumerate([1, 20, 70, 100])]

    async def scenario() -> None:
        for req in batch:
            skipped, tokens = await handoff(prefill, decode, req)
            deltas = run_disaggregated(reference_prefill, reference_decode, req)
            assert tokens == [t for d in deltas for t in d.new_token_ids], req.request_id
            assert skipped == 0
        again = replace(batch[-1], request_id="again")
        skipped, tokens = await handoff(prefill, decode, again)
        assert skipped == 6  # 3 cached blocks of 32 tokens (of 100) = 6 of the prefill's 16
        assert tokens == [t for d in deltas for t in d.new_token_ids]
        await settled(decode)
        await settled(prefill)
        assert await staged(decode) == 0

    loop_thread.run(scenario())


def test_a_full_area_refuses_and_every_ending_frees_it(workers, loop_thread) -> None:
    prefill, decode = workers

    async def scenario() -> None:
        # Three prompts of 4 blocks of 16 fill the area (12 blocks); nobody sends their KV.
        waiting = [request(f"w{i}", 60, seed=10 + i) for i in range(3)]
        for req in waiting[:2]:
            await decode.reserve(req, TIMEOUT_S, prefill.worker_id)
        # Times out on its own, after the two checks below.
        await decode.reserve(waiting[2], 2.0, prefill.worker_id)
        assert await staged(decode) == AREA_BLOCKS
        with pytest.raises(KVCapacityError, match="landing area of an unlike prefill worker"):
            await decode.reserve(request("full", 20, seed=20), TIMEOUT_S, prefill.worker_id)
        await decode.abort(waiting[0].request_id)
        with pytest.raises(WorkerFailedError, match=r"^KV transfer for w2 failed: "):
            await decode.admit("w2", 0, None, TIMEOUT_S, "ch-w2")
        for _ in range(200):
            if await staged(decode) == 4:  # the second prompt's, still waiting
                break
            await asyncio.sleep(0.025)
        assert await staged(decode) == 4
        await decode.abort(waiting[1].request_id)
        await settled(decode)
        assert await staged(decode) == 0
        # The area serves again.
        skipped, tokens = await handoff(prefill, decode, request("after", 60, seed=30))
        assert skipped == 0 and len(tokens) == 6

    loop_thread.run(scenario())


def test_the_routers_block_hashes_of_another_block_size_are_not_taken(workers, loop_thread) -> None:
    """The front door hashes prompts by the prefill pool's blocks (16 tokens) and sends the
    hashes with the request; a decode worker of 32-token blocks names its blocks by hashes of
    its own, so its KV events and prefix cache mean what they say."""
    prefill, decode = workers
    model_id = prefill.info().model_id
    req = request("h1", 70, seed=41)
    tokens = req.prompt_token_ids
    routed = hash_prompt_blocks(tokens, 16, model_root_hash(model_id, 16))
    own = hash_prompt_blocks(tokens, 32, model_root_hash(model_id, 32))

    async def scenario() -> None:
        hashed = replace(req, block_hashes=tuple(routed), block_size=16)
        await handoff(prefill, decode, hashed)
        await settled(decode)
        cached = await on_engine(
            decode, lambda r: {b.block_hash for b in r.engine.kv.pool.blocks if b.block_hash}
        )
        assert cached == set(own)
        on_prefill = await on_engine(
            prefill, lambda r: {b.block_hash for b in r.engine.kv.pool.blocks if b.block_hash}
        )
        assert on_prefill == set(routed)

    loop_thread.run(scenario())


def test_the_room_set_aside_for_landing_is_what_the_areas_take(workers, loop_thread) -> None:
    # What a GPU decode worker keeps out of its KV cache for an unlike prefill pool
    # (EngineConfig.landing_layout, engine/memory_profile.py) is what its areas allocate:
    # AREA_BLOCKS blocks of 16 tokens of float32 K and V in every layer and head.
    _, decode = workers

    def areas(rank: Any) -> tuple[int, int, int]:
        taken = sum(a.cache.numel() * a.cache.element_size() for a in rank.landings._areas.values())
        model = rank.engine.model_config
        tokens = rank.engine.max_model_len + DECODE.max_num_batched_tokens
        room = landing_bytes(rank.engine.runner.kv_layout, model.num_key_value_heads, 1,
                             PREFILL.block_size, "float32", tokens)  # fmt: skip
        entries = model.num_hidden_layers * model.num_key_value_heads * model.head_dim
        return taken, room, AREA_BLOCKS * 16 * 2 * 4 * entries

    taken, room, expected = loop_thread.run(on_engine(decode, areas))
    assert taken == room == expected
