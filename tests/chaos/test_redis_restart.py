"""Chaos under `--redis` (issue 19): Redis is killed and restarted (empty: it saves nothing)
while streams run and a decode worker dies. Redis carries only the routing index and the
pool sizes, so no request may fail or change: every stream is its fault-free one, the
router falls back to load while Redis is away, and once Redis is back the index refills
(a repeated prompt is routed to the workers that cache it) and the cluster settles."""

from __future__ import annotations

import asyncio

import pytest

from bench.chaos.driver import ChaosPlan, ChaosRun, settle
from bench.chaos.workload import workload
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import poll

pytestmark = pytest.mark.slow
SEED = 23
PLAN = ChaosPlan(
    seed=SEED,
    num_requests=None,  # until stopped
    duration_s=240.0,
    concurrency=4,
    kill_roles=("decode",),
    kill_every_tokens=250,
    max_kills=1,
    hang_up_share=0.0,
)


def test_redis_restart_under_load(cluster_factory, loop_thread, tiny_model_dir, own_redis) -> None:
    model_dir = tiny_model_dir("llama")
    spec = make_spec(model_dir, num_prefill=1, num_decode=2, redis_url=own_redis.url)
    cluster = cluster_factory(spec, always_disaggregate())
    store = cluster.router.store
    specs, references = workload(cluster.backend.tokenizer, model_dir, 6, 64, SEED)

    async def run() -> None:
        chaos = ChaosRun(cluster, specs, references, PLAN)
        load = asyncio.create_task(chaos.run())

        def tokens_past(n: int):
            at = chaos.report.num_tokens + n
            return lambda: chaos.report.num_tokens >= at

        await poll(tokens_past(60), 120, "streams under way")
        await asyncio.to_thread(own_redis.stop)
        await poll(lambda: not store.healthy, 30, "the router sees Redis down")
        await poll(tokens_past(300), 120, "streams go on without Redis")
        await asyncio.to_thread(own_redis.start)  # the same port, empty
        await poll(lambda: store.healthy, 60, "the router sees Redis back")
        await poll(tokens_past(300), 120, "streams go on with Redis back")
        chaos.stop()
        report = await asyncio.wait_for(load, 240)
        print(report.summary())
        assert report.ok, "\n".join(report.problems)
        assert report.counts["exact"] == report.num_requests  # Redis down fails nothing
        assert len(report.kills) == PLAN.max_kills

        # The index refills from the workers: the prompts just served are cached again.
        model_id = cluster.membership.model.model_id
        prompt = list(max(specs, key=lambda s: len(s.prompt)).prompt)
        assert len(prompt) >= 2 * cluster.membership.model.block_size

        def cached() -> bool:
            with cluster.router.route(model_id, prompt) as ticket:
                return ticket.decision.prefill_cached_blocks > 0

        await poll(cached, 60, "the index knows the prefill worker's cache again")
        await settle(cluster)

    loop_thread.run(run(), timeout=420)
