"""Aborting a request while its KV is on the wire frees its blocks only once no pull can
touch them, in both directions; the blocks' next owner keeps its KV byte for byte.

A prefill and a decode worker (real engines, tiny model, tp=1) in this process, connected
over the shm backend whose pulls pass a gate the test holds (tests/support/gated_driver.py).
Each side's KV cache holds exactly one prompt, so a next owner gets the aborted request's
blocks as soon as they are free, and not before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.errors import WorkerFailedError
from core.request import EngineRequest
from core.roles import WorkerRole
from decode_worker.worker import DecodeWorker
from prefill_worker.worker import PrefillWorker
from tests.support.gated_driver import BACKEND, Gate
from tests.support.worker_pair import (
    PROMPT_BLOCKS,
    TIMEOUT_S,
    cached_kv,
    connect_pair,
    on_engine,
    request,
    run_here,
    same,
    settled,
    spec,
)


def gate_of(worker: Any) -> Gate:
    return worker.group.rank.transport.driver.gate


async def held_transfer(prefill: PrefillWorker, decode: DecodeWorker, req: EngineRequest) -> Any:
    """Reserve, prefill, and hold the decode worker's first pull at its gate."""
    gate_of(decode).close()
    res = await decode.reserve(req, TIMEOUT_S, prefill.worker_id)
    reply = await prefill.prefill(req, decode.worker_id, res.dst_block_ids, 0, TIMEOUT_S)
    held = await asyncio.to_thread(gate_of(decode).holding.wait, 10)
    assert held, "the pull never reached the gate"
    return res, reply


async def give_a_chance(task: asyncio.Task) -> None:
    """Let `task` run as far as it can before the held pull goes on: were the blocks free
    too early, a tiny model's request would be done well within this."""
    await asyncio.wait({task}, timeout=0.5)


@pytest.fixture
def pair(tiny_model_dir, loop_thread):
    made: list[Any] = []

    def make(prefill_blocks: int, decode_blocks: int) -> tuple[PrefillWorker, DecodeWorker]:
        model = tiny_model_dir()
        prefill = PrefillWorker(spec("p0", WorkerRole.PREFILL, model, prefill_blocks, BACKEND))
        made.append(prefill)
        decode = DecodeWorker(spec("d0", WorkerRole.DECODE, model, decode_blocks, BACKEND))
        made.append(decode)
        loop_thread.run(connect_pair(prefill, decode))
        return prefill, decode

    yield make
    for worker in made:
        gate_of(worker).open()
        worker.shutdown()


def test_decode_abort_keeps_the_reservation_until_the_pull_ended(pair, loop_thread) -> None:
    prefill, decode = pair(prefill_blocks=2 * PROMPT_BLOCKS, decode_blocks=PROMPT_BLOCKS)
    a, b = request("a", 1), request("b", 2)

    async def scenario() -> None:
        await run_here(decode, b)  # the reference: b's KV, computed on this engine
        reference = await on_engine(decode, cached_kv)
        assert await on_engine(decode, lambda r: r.engine.kv.pool.reset_prefix_cache())
        await held_transfer(prefill, decode, a)
        await decode.abort(a.request_id)
        free = await on_engine(decode, lambda r: r.engine.kv.pool.num_free_blocks)
        assert free == 0, "a's blocks were freed while a pull may still write them"
        b_done = asyncio.create_task(run_here(decode, b))
        await give_a_chance(b_done)  # b, the blocks' next owner, waits for them
        gate_of(decode).open()
        await asyncio.wait_for(b_done, TIMEOUT_S)
        await settled(decode)
        await settled(prefill)
        after = await on_engine(decode, cached_kv)
        assert reference.keys() == after.keys()
        assert same(reference, after, reference), "b's KV was overwritten by a's late pull"

    loop_thread.run(scenario())


def test_prefill_abort_keeps_source_blocks_until_the_reader_ended(pair, loop_thread) -> None:
    prefill, decode = pair(prefill_blocks=PROMPT_BLOCKS, decode_blocks=2 * PROMPT_BLOCKS + 1)
    a, c = request("a", 1, max_tokens=2), request("c", 3, max_tokens=2)

    async def scenario() -> None:
        _, reply_a = await held_transfer(prefill, decode, a)
        sent = await on_engine(prefill, cached_kv)  # a's full blocks, as offered
        await prefill.abort(a.request_id)
        free = await on_engine(prefill, lambda r: r.engine.kv.pool.num_free_blocks)
        assert free == 0, "a's source blocks were freed while the decode worker reads them"
        res_c = await decode.reserve(c, TIMEOUT_S, prefill.worker_id)
        c_prefilled = asyncio.create_task(
            prefill.prefill(c, decode.worker_id, res_c.dst_block_ids, 0, TIMEOUT_S)
        )
        await give_a_chance(c_prefilled)  # c, the source blocks' next owner, waits for them
        gate_of(decode).open()
        reply_c = await asyncio.wait_for(c_prefilled, TIMEOUT_S)
        await decode.admit(c.request_id, reply_c.first_token, None, TIMEOUT_S, "ch")
        try:  # the reader either refuses a's KV, or it is exactly what was offered
            await decode.admit(a.request_id, reply_a.first_token, None, TIMEOUT_S, "ch")
            admitted_a = True
        except WorkerFailedError:
            admitted_a = False
        stream = decode.outputs("ch")
        await stream.aclose()
        await settled(decode)
        await settled(prefill)
        on_decode = await on_engine(decode, cached_kv)
        on_prefill = await on_engine(prefill, cached_kv)
        c_hashes = on_prefill.keys() - sent.keys()
        assert len(c_hashes) == PROMPT_BLOCKS - 1
        assert same(on_prefill, on_decode, c_hashes), "c's KV did not arrive intact"
        if admitted_a:
            assert same(sent, on_decode, sent), "a was admitted with KV it was not sent"

    loop_thread.run(scenario())


def test_a_reservation_from_a_sender_that_left_is_a_worker_failure_and_frees_its_blocks(
    pair, loop_thread
) -> None:
    """The prefill worker left (drained, disconnected) while a front door still routed to
    it: the decode worker refuses the reservation with WorkerFailedError (the request is
    retried elsewhere, and this healthy decode worker is not blamed) and holds nothing."""
    prefill, decode = pair(prefill_blocks=PROMPT_BLOCKS, decode_blocks=PROMPT_BLOCKS)
    loop_thread.run(decode.disconnect(prefill.worker_id))
    with pytest.raises(WorkerFailedError, match="no longer connected"):
        loop_thread.run(decode.reserve(request("a", 1), TIMEOUT_S, prefill.worker_id))
    load = loop_thread.run(decode.load())
    assert load.num_free_blocks == load.num_total_blocks and load.num_running == 0
