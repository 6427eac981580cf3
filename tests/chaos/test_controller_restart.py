"""A controller that dies is restarted by Ray and brings the pools back (issue 19).

Its workers die with it (Ray ends actors with their owner): requests in flight then must
end exact or with a clean error, none hung; the front door, polling the restarted
controller, makes it start the pools again under new worker ids; the cluster settles at
its desired sizes with every KV block free, and a new request is served exactly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.chaos.driver import settle
from bench.chaos.workload import workload
from tests.chaos.controller_kill import PLAN, kill_controller_under_load
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect

pytestmark = pytest.mark.slow
SEED = 31


def test_a_killed_controller_comes_back_with_its_pools(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir = tiny_model_dir("llama")
    cluster = cluster_factory(
        make_spec(model_dir, num_prefill=1, num_decode=1), always_disaggregate()
    )
    specs, references = workload(cluster.backend.tokenizer, model_dir, 4, 64, SEED)
    first_workers = set(cluster.membership.workers)

    async def run() -> None:
        await kill_controller_under_load(
            cluster, specs, references, replace(PLAN, seed=SEED), restart=True
        )

        await settle(cluster, timeout_s=240)  # pools at their sizes, every block free
        assert first_workers.isdisjoint(cluster.membership.workers), "dead workers reused"
        assert cluster.backend.is_ready()
        spec = specs[0]
        chunks: list[tuple[list[int], str]] = []
        await collect(cluster.backend, "after", list(spec.prompt), spec.params, chunks=chunks)
        expected = references[spec.name]
        assert [(tuple(ids), text) for ids, text in chunks] == expected

    loop_thread.run(run(), timeout=600)
