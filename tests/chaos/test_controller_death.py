"""Killing the controller for good (issue 19; `no_restart=True`: otherwise Ray restarts it,
test_controller_restart.py) takes the serving cluster down with it: Ray ends the worker
actors with their owner, the controller. What this test holds the cluster to is that the
outage is clean: streams that finished before it are exact, every other request fails with
a `core.errors` error before its deadline (503: the controller is gone, or 429: no worker
of a pool), none hangs, and the front door says it is not ready."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import ray

from bench.chaos.workload import workload
from core.errors import OverloadedError, WorkerFailedError
from core.sampling import SamplingParams
from router.frontdoor.backend import GenerateRequest
from tests.chaos.controller_kill import PLAN, kill_controller_under_load
from tests.cluster.conftest import always_disaggregate, make_spec

pytestmark = pytest.mark.slow
SEED = 29


def test_controller_death_fails_requests_cleanly(cluster_factory, loop_thread, tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    cluster = cluster_factory(
        make_spec(model_dir, num_prefill=1, num_decode=1), always_disaggregate()
    )
    specs, references = workload(cluster.backend.tokenizer, model_dir, 4, 64, SEED)
    workers = list(cluster.membership.workers.values())

    async def run() -> None:
        report = await kill_controller_under_load(
            cluster, specs, references, replace(PLAN, seed=SEED), restart=False
        )
        assert report.counts["clean_error"] > 0
        # 503 for a request that needed the controller (a retry, or no worker known);
        # 429 for one routed while this front door still knew a worker of one pool only
        assert set(report.errors) <= {"WorkerFailedError", "OverloadedError"}

        # The workers went with their owner, and a new request fails at once, cleanly.
        for m in workers:
            with pytest.raises(ray.exceptions.RayActorError):
                await asyncio.wait_for(m.handle.ping.remote(), 30)
        request = GenerateRequest("after", list(specs[0].prompt), SamplingParams(max_tokens=4), 30)
        with pytest.raises((WorkerFailedError, OverloadedError)):
            async for _ in cluster.backend.generate(request):
                pass
        assert not cluster.backend.is_ready()

    loop_thread.run(run(), timeout=300)
