"""Output channels: many requests' deltas handed over in one batch per engine step, in order,
the same tokens as a stream per request; the worker's outlet enforces deadlines."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.config import EngineConfig
from core.errors import DeadlineExceededError
from core.request import OutputDelta
from core.sampling import SamplingParams
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.output_channel import Item, OutputChannel
from worker.outlets import Outlet

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> Path:
    return tiny_model_dir()


def reference(model: Path, max_tokens: int) -> list[list[int]]:
    llm = LLMEngine(model, EngineConfig(num_kv_blocks=64))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(PROMPTS):
        llm.add_request(str(i), p, params)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    while llm.has_unfinished():
        for out in llm.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[str(i)] for i in range(len(PROMPTS))]


async def collect(engine: AsyncEngine, channel: OutputChannel, max_tokens: int) -> list[list[Item]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(len(PROMPTS)):
        engine.open_stream(str(i), channel)

    def add_all(e: LLMEngine) -> None:  # one command: every request starts in the same step
        for i, p in enumerate(PROMPTS):
            e.add_request(str(i), p, params)

    await engine.call(add_all)
    batches: list[list[Item]] = []
    open_ids = {str(i) for i in range(len(PROMPTS))}
    while open_ids:
        batch = await asyncio.wait_for(channel.next_batch(None), 30)
        batches.append(batch)
        for rid, item in batch:
            assert isinstance(item, OutputDelta)
            if item.finished:
                open_ids.discard(rid)
    return batches


def test_a_step_is_one_batch_and_tokens_match_per_request_streams(model: Path) -> None:
    expected = reference(model, 6)
    engine = AsyncEngine(LLMEngine(model, EngineConfig(num_kv_blocks=64)))
    try:

        async def main() -> list[list[Item]]:
            return await collect(engine, OutputChannel(asyncio.get_running_loop()), 6)

        batches = asyncio.run(main())
    finally:
        engine.stop()
    got: dict[str, list[int]] = {}
    for batch in batches:
        for rid, item in batch:
            got.setdefault(rid, []).extend(item.new_token_ids)  # type: ignore[union-attr]
    assert [got[str(i)] for i in range(len(PROMPTS))] == expected
    # Three requests stepping together: far fewer hand-overs than deltas.
    assert len(batches) < sum(len(b) for b in batches)


def test_outlet_fails_a_request_past_its_deadline_and_aborts_it() -> None:
    aborted: list[str] = []

    async def main() -> list[Item]:
        outlet = Outlet("c1")
        outlet.watch("slow", 0.05)
        outlet.watch("fine", 30)
        batch = await asyncio.wait_for(outlet.next_batch(aborted.append), 5)
        assert outlet.open_requests == ["fine"]
        return batch

    batch = asyncio.run(main())
    assert aborted == ["slow"]
    assert [rid for rid, _ in batch] == ["slow"]
    assert isinstance(batch[0][1], DeadlineExceededError)
