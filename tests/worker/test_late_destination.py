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


def test_blocks_named_while_the_prompt_computes_take_each_layer_as_it_is_written(
    shm_pair, loop_thread
) -> None:
    """Named in the middle of the prompt's step (the engine thread still in its layers): the
    layer written so far goes at once, from the worker's thread, and every later one from
    the step as it is written, not after the step; the decode worker gets the KV it would
    have computed itself."""
    prefill, decode = shm_pair
    req = request("mid", seed=6, max_tokens=4)
    reference_req = request("mid-ref", seed=6, max_tokens=4)
    mid_step, named = threading.Event(), threading.Event()
    posted: list[tuple[int, str]] = []

    def watch(rank) -> None:
        runner, connector = rank.engine.runner, rank.connector
        event, send_layer = runner.layer_event, connector._send_layer

        def layer_event(layer: int):
            if layer == 1:  # layer 0 is written: hold the step until the blocks are named
                mid_step.set()
                assert named.wait(TIMEOUT_S)
            return event(layer)

        def record(send, layer, written) -> None:
            posted.append((layer, threading.current_thread().name))
            send_layer(send, layer, written)

        runner.layer_event, connector._send_layer = layer_event, record

    async def scenario() -> None:
        await run_here(decode, reference_req)
        reference = await on_engine(decode, cached_kv)
        assert await on_engine(decode, lambda r: r.engine.kv.pool.reset_prefix_cache())
        await on_engine(prefill, watch)
        computing = asyncio.ensure_future(
            prefill.prefill(req, decode.worker_id, None, 0, TIMEOUT_S)
        )
        assert await asyncio.to_thread(mid_step.wait, TIMEOUT_S)
        res = await decode.reserve(req, TIMEOUT_S, prefill.worker_id)
        await prefill.destination(req.request_id, res.dst_block_ids, res.skip_blocks)
        assert posted == [(0, threading.current_thread().name)]  # at once, from here
        named.set()
        reply = await computing
        layers = prefill.group.rank.engine.model_config.num_hidden_layers
        assert [layer for layer, _ in posted] == list(range(layers))
        assert {thread for _, thread in posted[1:]} == {"engine-loop"}  # from the step
        await admit_and_decode(decode, req.request_id, reply.first_token)
        await settled(decode)
        await settled(prefill)
        after = await on_engine(decode, cached_kv)
        assert same(reference, after, reference.keys()), "the decode worker got other KV"

    loop_thread.run(scenario())


def test_blocks_named_before_the_prompt_runs_are_used_as_if_given(shm_pair, loop_thread) -> None:
    """Named while the prompt's `prefill` still waits behind the engine thread (the blocks
    are named from the worker's own thread at once): kept for it, and the prompt runs with
    them as if they had come with it, never waiting for them."""
    prefill, decode = shm_pair
    req = request("early", seed=9, max_tokens=3)
    hold = threading.Event()
    waited: list[str] = []

    def watch(rank) -> None:
        connector = rank.connector
        begin = connector.begin_step

        def begin_step(completing):
            hook = begin(completing)
            waited.extend(connector.awaiting)
            return hook

        connector.begin_step = begin_step

    async def scenario() -> None:
        await on_engine(prefill, watch)
        res = await decode.reserve(req, TIMEOUT_S, prefill.worker_id)
        # The engine thread held: the prompt's call queues behind it; its blocks do not.
        held = asyncio.ensure_future(on_engine(prefill, lambda _: hold.wait(TIMEOUT_S)))
        computing = asyncio.ensure_future(
            prefill.prefill(req, decode.worker_id, None, 0, TIMEOUT_S)
        )
        await asyncio.sleep(0.1)
        await prefill.destination(req.request_id, res.dst_block_ids, res.skip_blocks)
        rank = prefill.group.rank
        assert req.request_id in rank.connector._early  # before the prompt was even added
        hold.set()
        await held
        reply = await computing
        assert len(await admit_and_decode(decode, req.request_id, reply.first_token)) == 3
        await settled(decode)
        await settled(prefill)
        assert not rank.connector._early

    loop_thread.run(scenario())
    assert waited == []


def test_no_destination_in_time_fails_the_transfer_and_frees_the_blocks(
    shm_pair, loop_thread
) -> None:
    prefill, _ = shm_pair
    req = request("lost", seed=3, max_tokens=4)

    async def scenario() -> None:
        # 2 s: the first step's token and the read below come well before the wait ends.
        await prefill.prefill(req, "d0", None, 0, 2.0)
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
