"""The autoscaler on a real cluster: a queue grows the prefill pool, calm drains it back,
the prefill pool goes to zero and returns, and every request is served exactly throughout."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.sampling import SamplingParams
from router.cluster.admin import ControllerAdmin
from router.cluster.autoscale.policy import AutoscaleConfig
from router.frontdoor.http.admin_routes import refresh_cluster_metrics
from router.frontdoor.metrics import Metrics
from tests import oracle
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts, wait_for

pytestmark = pytest.mark.slow
SHORT = 8
PARAMS = SamplingParams(max_tokens=SHORT, temperature=0.0, ignore_eos=True)


def fast_config(min_prefill: int) -> AutoscaleConfig:
    # A TTFT target no burst can meet (its queue share is 25 ms), a latency target nothing
    # misses, quick looks and short cool-downs: the test is about mechanics, not tuning.
    return AutoscaleConfig(
        ttft_slo_s=0.05,
        itl_slo_s=30.0,
        min_sizes={"prefill": min_prefill, "decode": 1},
        max_sizes={"prefill": 2, "decode": 1},
        interval_s=0.25,
        up_cooldown_s=0.0,
        down_cooldown_s=1.0,
        calm_periods=3,
    )


def serve_burst(cluster, loop_thread, batch, sizes_seen: list[int]) -> list:  # type: ignore[no-untyped-def]
    """Every prompt at once; the prefill pool's desired size is sampled meanwhile."""

    async def run() -> list:
        tasks = [
            asyncio.create_task(collect(cluster.backend, f"a{i}-{time.monotonic_ns()}", p, PARAMS))
            for i, p in enumerate(batch)
        ]
        while not all(t.done() for t in tasks):
            sizes = await cluster.controller.get_desired.remote()
            sizes_seen.append(sizes["prefill"])
            await asyncio.sleep(0.05)
        return [t.result() for t in tasks]

    return loop_thread.run(run(), timeout=240)


def check_exact(model_dir, batch, outs) -> None:  # type: ignore[no-untyped-def]
    for p, out in zip(batch, outs, strict=True):
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), SHORT)


def autoscaled(cluster_factory, tiny_model_dir, min_prefill: int):  # type: ignore[no-untyped-def]
    """(model dir, cluster): 1 prefill + 1 decode worker under `fast_config`."""
    model_dir = tiny_model_dir("llama")
    spec = make_spec(model_dir, num_prefill=1, num_decode=1, autoscale=fast_config(min_prefill))
    return model_dir, cluster_factory(spec, always_disaggregate())


def long_burst(cluster, loop_thread, model_dir, seed: int) -> list[int]:  # type: ignore[no-untyped-def]
    """48 long prompts at once, every output checked exact (nothing lost or changed while the
    pools moved); returns the prefill pool's desired sizes seen meanwhile."""
    sizes_seen: list[int] = []
    batch = prompts(48, 1000, [700, 900, 800], seed=seed)
    check_exact(model_dir, batch, serve_burst(cluster, loop_thread, batch, sizes_seen))
    return sizes_seen


def test_a_queue_grows_the_prefill_pool_and_calm_drains_it_back(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    import ray

    model_dir, cluster = autoscaled(cluster_factory, tiny_model_dir, min_prefill=1)
    sizes_seen = long_burst(cluster, loop_thread, model_dir, seed=61)
    status = ray.get(cluster.controller.autoscale_status.remote(), timeout=30)
    ups = [d for d in status["history"] if d["pool"] == "prefill" and d["target"] > d["size"]]
    assert ups and max(sizes_seen) == 2, (sizes_seen, status["history"])
    assert "over target" in ups[0]["reason"] and ups[0]["pressure"] > 1
    # The admin view (dashboard, admin API) and the metrics show the latest decisions.
    admin = ControllerAdmin(cluster.controller, cluster.membership)
    state = loop_thread.run(admin.state(), timeout=30)
    shown = state.pool("prefill").autoscale
    assert shown is not None and {"target", "pressure", "reason", "signals"} <= set(shown)
    assert {"terms", "min_size", "max_size", "capacity_per_worker"} <= set(shown)
    grown = [d for d in state.autoscale_history if d["pool"] == "prefill"]
    assert grown and grown[0]["target"] > grown[0]["size"]  # the dashboard's decision list
    metrics = Metrics()
    loop_thread.run(refresh_cluster_metrics(admin, metrics), timeout=30)
    exported = metrics.exposition()[0].decode()
    assert 'baton:autoscale_pressure{pool="prefill"}' in exported
    assert 'baton:autoscale_pressure_term{pool="prefill",term="queue_wait"}' in exported
    assert 'baton:autoscale_max_workers{pool="prefill"} 2.0' in exported
    # The capacity per worker the scale-down reads is exported exactly when the pool has
    # shown one (saturated with every worker it wanted ready: on a slow host the burst may
    # end before the second worker is up; tests/frontdoor/test_metrics.py pins the values).
    capacity_line = 'baton:autoscale_capacity_tokens_per_second{pool="prefill"}'
    # (Once shown it stays shown, so reading the state before and after the export is exact.)
    after = loop_thread.run(admin.state(), timeout=30).pool("prefill").autoscale
    assert shown["capacity_per_worker"] is None or capacity_line in exported
    assert capacity_line not in exported or after["capacity_per_worker"] is not None
    wait_for(cluster, "prefill", 1)  # calm: drained back to its minimum
    status = ray.get(cluster.controller.autoscale_status.remote(), timeout=30)
    downs = [d for d in status["history"] if d["pool"] == "prefill" and d["target"] < d["size"]]
    assert downs and "calm" in downs[-1]["reason"]
    # The pool that is left still serves, exactly.
    batch = prompts(4, 1000, [50, 90], seed=62)
    check_exact(model_dir, batch, serve_burst(cluster, loop_thread, batch, []))


def test_the_prefill_pool_goes_to_zero_when_idle_and_returns_under_load(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir, cluster = autoscaled(cluster_factory, tiny_model_dir, min_prefill=0)
    wait_for(cluster, "prefill", 0)  # idle: decode workers will prefill alone
    loop_thread.run(cluster.membership.sync(), timeout=30)
    sizes_seen = long_burst(cluster, loop_thread, model_dir, seed=63)
    assert max(sizes_seen) >= 1, sizes_seen  # the decode queue brought prefill back
