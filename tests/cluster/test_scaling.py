"""Scaling a pool up and down while requests stream loses and corrupts none."""

from __future__ import annotations

import asyncio
import time

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


def test_a_new_worker_survives_a_peer_that_died_unnoticed(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    """A decode worker starting while its prefill peer dies (before any health check has
    seen it) must still come up: the dead peer is the health check's to replace, not a
    reason to throw the new worker away. Then the peer is replaced and all serve exactly."""
    import ray

    model_dir = tiny_model_dir("llama")
    # No periodic health check during the test: the dead peer stays "ready" until asked.
    spec = make_spec(model_dir, num_prefill=1, num_decode=1, health_interval_s=600.0)
    cluster = cluster_factory(spec, always_disaggregate())
    controller = cluster.controller
    prefill = next(m for m in cluster.membership.workers.values() if m.role == "prefill")
    ray.get(controller.scale.remote("decode", 2), timeout=30)
    deadline = time.monotonic() + 60

    def starting() -> bool:
        _, members = ray.get(controller.get_members.remote(), timeout=30)
        return any(m.state == "starting" for m in members)

    while not starting():
        assert time.monotonic() < deadline, "no decode worker started"
        time.sleep(0.01)
    ray.kill(prefill.handle, no_restart=True)  # past the health check, while D2 loads
    assert ray.get(controller.wait_ready.remote(120), timeout=150) is None
    ray.get(controller.scale.remote("prefill", 1), timeout=30)  # a reconcile: replaces P
    deadline = time.monotonic() + 120
    while True:
        _, members = ray.get(controller.get_members.remote(), timeout=30)
        ready = [m for m in members if m.state == "ready"]
        if prefill.worker_id not in {m.worker_id for m in members} and len(ready) == 3:
            break
        assert time.monotonic() < deadline, [(m.worker_id, m.state) for m in members]
        time.sleep(0.1)
    loop_thread.run(cluster.membership.sync(), timeout=30)
    batch = prompts(4, 1000, [30, 80], seed=43)

    async def run() -> list:
        return await asyncio.gather(
            *(collect(cluster.backend, f"dp{i}", p, PARAMS) for i, p in enumerate(batch))
        )

    for p, out in zip(batch, loop_thread.run(run(), timeout=120), strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), LONG)
