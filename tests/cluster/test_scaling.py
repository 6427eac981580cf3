"""Scaling a pool up and down while requests stream loses and corrupts none."""

from __future__ import annotations

import asyncio

import pytest

from core.sampling import SamplingParams
from tests import oracle
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts

pytestmark = pytest.mark.slow
LONG = 100
PARAMS = SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True)


def test_scale_up_and_down_while_streaming(cluster_factory, loop_thread, tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    cluster = cluster_factory(
        make_spec(model_dir, num_prefill=1, num_decode=1), always_disaggregate()
    )
    backend, controller = cluster.backend, cluster.controller
    batch = prompts(10, 1000, [20, 60, 100, 35, 150], seed=41)

    async def run() -> list:
        tasks = []
        for i, p in enumerate(batch[:5]):
            tasks.append(asyncio.create_task(collect(backend, f"s{i}", p, PARAMS)))
        await controller.scale.remote("decode", 2)
        await controller.scale.remote("prefill", 2)
        while len(cluster.membership.workers) < 4:
            await asyncio.sleep(0.2)
        for i, p in enumerate(batch[5:], start=5):
            tasks.append(asyncio.create_task(collect(backend, f"s{i}", p, PARAMS)))
        await asyncio.sleep(0.5)
        await controller.scale.remote("decode", 1)
        await controller.scale.remote("prefill", 1)
        return await asyncio.gather(*tasks)

    outs = loop_thread.run(run(), timeout=240)
    for p, out in zip(batch, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), LONG)

    async def settled() -> int:
        while len(cluster.membership.workers) != 2:
            await asyncio.sleep(0.2)
        return len(cluster.membership.workers)

    assert loop_thread.run(settled(), timeout=120) == 2
