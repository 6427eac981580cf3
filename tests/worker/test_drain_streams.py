"""A drained decode worker ends each output stream only once it has sent everything it had:
the controller stops the worker when `drain` returns, and a stream cut by that stop has its
front door retry a request the worker had finished (seen: a drained worker stopped with a
stream's last two tokens still on their way). A real worker in this process; the stream is
read as its front door would read it."""

from __future__ import annotations

import asyncio

from core.config import EngineConfig
from core.request import EngineRequest
from core.roles import WorkerRole
from core.sampling import SamplingParams
from decode_worker.worker import DecodeWorker
from worker.rank import WorkerRank
from worker.records import WorkerSpec

ENGINE = EngineConfig(num_kv_blocks=64, max_model_len=128, max_num_batched_tokens=64)


def test_a_drain_ends_when_the_last_tokens_went_out(tiny_model_dir, loop_thread) -> None:
    worker = DecodeWorker(
        WorkerSpec("d0", WorkerRole.DECODE, str(tiny_model_dir()), ENGINE, transport="shm")
    )
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    async def scenario() -> None:
        stream = worker.outputs("door")
        await worker.generate(EngineRequest("r", list(range(3, 20)), params), 30.0, "door")
        while await worker.engine.call(lambda g: g.first(WorkerRank.num_in_flight)):
            await asyncio.sleep(0.01)  # finished in the engine, its tokens not read yet
        drained = asyncio.ensure_future(worker.drain(10.0))
        await asyncio.sleep(0.3)
        assert not drained.done(), "drained with the request's tokens still unsent"
        items = [item async for batch in stream for item in batch if item[0] == "r"]
        assert sum(len(delta.new_token_ids) for _, delta in items) == 6
        assert items[-1][1].finished
        assert await asyncio.wait_for(drained, 10) == 0  # the stream ended: then the drain

    try:
        loop_thread.run(scenario(), timeout=60)
    finally:
        worker.shutdown()
