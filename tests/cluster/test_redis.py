"""With `--redis`: a second router sees the first's index, and a restarted controller keeps
the pool sizes."""

from __future__ import annotations

import pytest
import ray

from core.sampling import SamplingParams
from router.cluster.controller import Controller
from router.routing.index import make_store
from router.routing.route import Router
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts, wait_until_cached
from tests.router.conftest import redis_server  # noqa: F401 - the session fixture

pytestmark = pytest.mark.slow


def test_second_router_and_restarted_controller(
    cluster_factory,
    loop_thread,
    tiny_model_dir,
    redis_server,  # noqa: F811
) -> None:
    model_dir = tiny_model_dir("llama")
    spec = make_spec(model_dir, num_prefill=1, num_decode=1, redis_url=redis_server.url)
    cluster = cluster_factory(spec, always_disaggregate(), name="ctl-redis")
    [prompt] = prompts(1, 1000, [200], seed=51)
    loop_thread.run(collect(cluster.backend, "r1", prompt, SamplingParams(max_tokens=4)))
    # Another router replica, sharing only Redis, sees which workers cache the prompt
    # once the poller has published the workers' KV events there.
    other = Router(always_disaggregate(), store=make_store("redis", url=redis_server.url))
    try:
        model_id = cluster.membership.model.model_id
        other.register_model(model_id, 16)
        for m in cluster.membership.workers.values():
            other.add_worker(m.worker_id, m.role, model_id)
        # The prefill worker, and the decode worker it sent the blocks to.
        wait_until_cached(other, model_id, prompt, 200 // 16, num_workers=2)
        decision = other.route(model_id, prompt).decision
        assert decision.prefill_cached_blocks == 200 // 16
        assert decision.decode_cached_blocks == 200 // 16
    finally:
        other.close()

    # The controller's desired sizes live in Redis: a new controller picks them up.
    ray.get(cluster.controller.scale.remote("decode", 2), timeout=30)
    fresh = ray.remote(Controller).options(name="ctl-redis-2", num_cpus=0).remote(spec)
    try:
        assert ray.get(fresh.get_desired.remote(), timeout=30) == {"prefill": 1, "decode": 2}
    finally:
        ray.kill(fresh)
