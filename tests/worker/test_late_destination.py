"""A prompt computed before its destination blocks are known, as the front door runs a
disaggregated request (router/cluster/attempt.py: the decode worker reserves while the
prefill worker computes): its layers wait for `destination()`, then go, and the decode
worker ends with the KV it would have computed itself, its tokens those of a destination
given up front. Named before the prompt's step, the blocks are used as if given with it.
With no destination in time, or an abort while waiting, the transfer fails and every block
goes back.

Real prefill and decode workers (tiny model, shm transport, this process)."""

from __future__ import annotations

import asyncio
import threading

from tests.support.worker_pair import (
    PROMPT_BLOCKS,
    TIMEOUT_S,
    admit_and_decode,
    cached_kv,
    on_engine,
    request,
    run_here,
    same,
    settled,
)


def test_layers_computed_first_go_once_the_blocks_are_named(shm_pair, loop_thread) -> None:
    prefill, decode = shm_pair
    req = request("r", seed=5, max_tokens=6)
    reference_req = request("ref", seed=5, max_tokens=6)

    async def scenario() -> None:
        await run_here(decode, reference_req)  # the reference: its KV computed on D itself
        reference = await on_engine(decode, cached_kv)
        assert await on_engine(decode, lambda r: r.engine.kv.pool.reset_prefix_cache())
        # P computes the prompt with nowhere to send it yet: its first token comes back.
        reply = await prefill.prefill(req, decode.worker_id, None, 0, TIMEOUT_S)
        assert await on_engine(prefill, lambda r: r.connector.awaiting.keys()) == {"r"}
        res = await decode.reserve(req, TIMEOUT_S, prefill.worker_id)
        assert res.skip_blocks == 0 and reply.num_blocks == PROMPT_BLOCKS
        await prefill.destination(req.request_id, res.dst_block_ids, res.skip_blocks)
        got = await admit_and_decode(decode, req.request_id, reply.first_token)
        await settled(decode)
        await settled(prefill)
        after = await on_engine(decode, cached_kv)
        assert reference.keys() == after.keys()
        assert same(reference, after, reference), "the decode worker got other KV"
        # The same prompt with its blocks given up front decodes to the same tokens.
        again = request("again", seed=5, max_tokens=6)
        assert await on_engine(decode, lambda r: r.engine.kv.pool.reset_prefix_cache())
        res = await decode.reserve(again, TIMEOUT_S, prefill.worker_id)
        up_front = await prefill.prefill(
            again, decode.worker_id, res.dst_block_ids, res.skip_blocks, TIMEOUT_S
        )
        assert got == await admit_and_decode(decode, again.request_id, up_front.first_token)
        assert len(got) == 6

    loop_thread.run(scenario())


def test_blocks_named_before_the_prompt_runs_are_used_as_if_given(shm_pair, loop_thread) -> None:
    prefill, decode = shm_pair
    req = request("early", seed=9, max_tokens=3)
    hold = threading.Event()
    named_while_queued: list[bool] = []

    def watch(rank) -> None:
        connector = rank.connector
        name = connector.set_destination

        def set_destination(request_id: str, *args) -> None:
            named_while_queued.append(request_id in connector.destinations)
            name(request_id, *args)

        connector.set_destination = set_destination

    async def scenario() -> None:
        await on_engine(prefill, watch)
        res = await decode.reserve(req, TIMEOUT_S, prefill.worker_id)
        # The engine thread held: the prompt's call and its blocks' queue behind, and run in
        # one turn of it, before the step that computes the prompt.
        held = asyncio.ensure_future(on_engine(prefill, lambda _: hold.wait(TIMEOUT_S)))
        computing = asyncio.ensure_future(
            prefill.prefill(req, decode.worker_id, None, 0, TIMEOUT_S)
        )
        await asyncio.sleep(0.1)
        naming = asyncio.ensure_future(
            prefill.destination(req.request_id, res.dst_block_ids, res.skip_blocks)
        )
        await asyncio.sleep(0.1)
        hold.set()
        await held
        await naming
        reply = await computing
        assert len(await admit_and_decode(decode, req.request_id, reply.first_token)) == 3
        await settled(decode)
        await settled(prefill)

    loop_thread.run(scenario())
    assert named_while_queued == [True]


def test_no_destination_in_time_fails_the_transfer_and_frees_the_blocks(
    shm_pair, loop_thread
) -> None:
    prefill, _ = shm_pair
    req = request("lost", seed=3, max_tokens=4)

    async def scenario() -> None:
        await prefill.prefill(req, "d0", None, 0, 0.3)
        assert await on_engine(prefill, lambda r: r.engine.kv.pool.num_used_blocks) > 0
        await settled(prefill)  # the wait ran out: the transfer failed, the blocks went back
        assert await on_engine(prefill, lambda r: not r.connector.awaiting)

    loop_thread.run(scenario())


def test_an_abort_while_waiting_for_the_blocks_frees_them(shm_pair, loop_thread) -> None:
    prefill, _ = shm_pair
    req = request("gone", seed=4, max_tokens=4)

    async def scenario() -> None:
        await prefill.prefill(req, "d0", None, 0, TIMEOUT_S)
        assert await on_engine(prefill, lambda r: r.engine.kv.pool.num_used_blocks) > 0
        await prefill.abort(req.request_id)
        await settled(prefill)
        # Named after the abort: nothing happens.
        await prefill.destination(req.request_id, [0, 1, 2, 3], 0)
        await settled(prefill)

    loop_thread.run(scenario())
