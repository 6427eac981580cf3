"""Workers dying mid-stream (`ray.kill`): requests complete with the right tokens (retried
on another worker from where they were), or end with a clear error, within their deadline;
the pool returns to its desired size."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from core.errors import BatonError
from core.sampling import SamplingParams
from tests import oracle
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts

pytestmark = pytest.mark.slow
LONG = 120
PARAMS = SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True)


def run_with_kill(cluster, loop_thread, batch, victim_role: str) -> list:
    backend = cluster.backend

    async def run() -> list:
        started = [asyncio.Event() for _ in batch]
        tasks = [
            asyncio.create_task(collect(backend, f"k{i}", p, PARAMS, 90.0, started[i]))
            for i, p in enumerate(batch)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        victim = next(m for m in cluster.membership.workers.values() if m.role == victim_role)
        ray.kill(victim.handle, no_restart=True)
        return await asyncio.gather(*tasks, return_exceptions=True)

    return loop_thread.run(run(), timeout=180)


def wait_for_pools(cluster, loop_thread, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, members = ray.get(cluster.controller.get_members.remote(), timeout=30)
        desired = ray.get(cluster.controller.get_desired.remote(), timeout=30)
        ready = {p: sum(1 for m in members if m.role == p and m.state == "ready") for p in desired}
        if ready == desired:
            return
        time.sleep(0.5)
    raise AssertionError(f"pools did not return to {desired}: {ready}")


def check(outs: list, batch: list, model_dir) -> None:
    for p, out in zip(batch, outs, strict=True):
        if isinstance(out, BaseException):
            assert isinstance(out, BatonError), f"unclear error: {out!r}"
            continue
        assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), LONG)
    assert sum(not isinstance(o, BaseException) for o in outs) >= len(batch) // 2


@pytest.mark.parametrize(
    ("victim", "num_prefill", "num_decode"),
    [("decode", 1, 2), ("prefill", 2, 1), ("decode", 1, 1)],
    ids=["decode", "prefill", "only-decode"],
)
def test_kill_worker_mid_stream(
    cluster_factory, loop_thread, tiny_model_dir, victim: str, num_prefill: int, num_decode: int
) -> None:
    """With a spare worker the retry goes there at once; killing the only decode worker
    makes the retries wait for the controller's replacement, within the deadline."""
    model_dir = tiny_model_dir("llama")
    spec = make_spec(model_dir, num_prefill=num_prefill, num_decode=num_decode)
    cluster = cluster_factory(spec, always_disaggregate())
    batch = prompts(6, 1000, [30, 70, 120, 45, 90, 200], seed=31)
    outs = run_with_kill(cluster, loop_thread, batch, victim)
    check(outs, batch, model_dir)
    wait_for_pools(cluster, loop_thread)
    # and the cluster serves again
    p = prompts(1, 1000, [50], seed=32)[0]
    out = loop_thread.run(collect(cluster.backend, "after", p, PARAMS))
    assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(p), LONG)
