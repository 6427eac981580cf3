"""A decode worker's output channel carries its reports when the front door asks for them
(decode_worker/worker.py `outputs`): the load and the KV events after the door's cursor ride
the step batches, so the door need not poll a worker it streams from (router/cluster/
membership.py). A real decode worker (tiny model) in this process."""

from __future__ import annotations

import asyncio
from typing import Any

from core.events import BlockStored, WorkerLoad
from core.roles import WorkerRole
from decode_worker.worker import DecodeWorker
from engine.output_channel import is_final
from tests.support.worker_pair import TIMEOUT_S, request, spec
from worker.records import WorkerReport


async def _read(stream: Any, request_id: str, until_a_report: bool = False) -> list[Any]:
    """Every item of the stream's batches until `request_id`'s last (and, with
    `until_a_report`, a report: when the engine ran the whole request before the stream was
    read, its tokens come in one batch and the report asked after it rides the idle wake-up),
    for at most TIMEOUT_S."""

    async def read() -> list[Any]:
        items: list[Any] = []
        async for batch in stream:
            items += batch
            done = any(rid == request_id and is_final(item) for rid, item in items)
            if done and (not until_a_report or any(not rid for rid, _ in items)):
                return items
        return items

    try:
        return await asyncio.wait_for(read(), TIMEOUT_S)
    finally:
        await stream.aclose()


def test_reports_ride_the_batches_with_the_events_after_the_cursor(
    tiny_model_dir, loop_thread
) -> None:
    decode = DecodeWorker(spec("d0", WorkerRole.DECODE, tiny_model_dir(), 16, "shm"))

    async def scenario() -> None:
        before = await decode.report(-1)
        cursor = before.events[-1].seq if before.events else -1
        first, second = request("a", seed=1, max_tokens=12), request("b", seed=2, max_tokens=4)

        await decode.generate(first, TIMEOUT_S, "asked")
        items = await _read(decode.outputs("asked", 0.0, cursor), "a", until_a_report=True)
        reports = [item for rid, item in items if not rid]
        assert reports and all(isinstance(r, WorkerReport) for r in reports)
        assert all(isinstance(r.load, WorkerLoad) and r.load.worker_id == "d0" for r in reports)
        seqs = [batch.seq for r in reports for batch in r.events]
        assert seqs == sorted(set(seqs)) and all(seq > cursor for seq in seqs)
        stored = [
            e for r in reports for b in r.events for e in b.events if isinstance(e, BlockStored)
        ]
        assert stored, "the prompt's blocks were not reported"

        await decode.generate(second, TIMEOUT_S, "not-asked")
        items = await _read(decode.outputs("not-asked"), "b")
        assert items and all(rid == "b" for rid, _ in items)

    try:
        loop_thread.run(scenario())
    finally:
        decode.shutdown()
