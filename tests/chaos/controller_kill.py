"""What the controller tests share: streaming load through the cluster, the controller
killed once the streams are under way, and the run's report once every request ended."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import ray

from bench.chaos.driver import ChaosPlan, ChaosReport, ChaosRun

PLAN = ChaosPlan(
    num_requests=10,
    concurrency=4,
    timeout_s=60.0,
    kill_every_tokens=None,  # no worker kills: the controller's death is the fault
    hang_up_share=0.0,
)


async def kill_controller_under_load(
    cluster: Any, specs: list, references: dict, plan: ChaosPlan, restart: bool
) -> ChaosReport:
    """Kill the controller (`restart`: so that Ray restarts it) after a seeded number of
    streamed tokens (40-120); the report, checked: every request exact or a clean error,
    none hung."""
    chaos = ChaosRun(cluster, specs, references, plan)
    load = asyncio.create_task(chaos.run())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    at_tokens = random.Random(plan.seed).randint(40, 120)
    while chaos.report.num_tokens < at_tokens:
        assert loop.time() < deadline, "streams never got under way"
        await asyncio.sleep(0.02)
    ray.kill(cluster.controller, no_restart=not restart)
    report = await asyncio.wait_for(load, plan.timeout_s + plan.grace_s + 60)
    print(report.summary())
    assert report.ok, "\n".join(report.problems)
    return report
