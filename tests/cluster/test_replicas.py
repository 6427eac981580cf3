"""Front-door replicas: a second front door attached to the same controller sees every KV
event of every worker (each reads the workers' event logs on its own), so both route a
prompt to the worker that caches it."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from core.sampling import SamplingParams
from router.cluster.bringup import start_cluster
from tests.cluster.conftest import always_disaggregate, make_spec
from tests.cluster.helpers import collect, prompts

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def cached_blocks(cluster, prompt: list[int]) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(prefill, decode) cached prefix blocks of `prompt`, as this front door's router sees."""
    with cluster.router.route(cluster.membership.model.model_id, prompt) as ticket:
        return ticket.decision.prefill_cached_blocks, ticket.decision.decode_cached_blocks


def test_every_front_door_sees_every_event(cluster_factory, loop_thread, tiny_model_dir) -> None:
    name = f"ctl-{os.urandom(3).hex()}"
    first = cluster_factory(make_spec(tiny_model_dir("llama")), always_disaggregate(), name)
    second = loop_thread.run(
        start_cluster(None, always_disaggregate(), controller_name=name, attach=True)
    )
    try:
        assert second.spec == first.spec  # the replica took the cluster's settings
        with pytest.raises(RuntimeError, match="no Baton controller"):
            loop_thread.run(start_cluster(None, controller_name="ctl-nobody", attach=True))
        batch = prompts(6, 1000, [160, 200, 96], seed=5)

        async def run() -> None:  # through both front doors
            await asyncio.gather(
                *(collect((first, second)[i % 2].backend, f"r{i}", p, GREEDY)
                  for i, p in enumerate(batch))
            )  # fmt: skip

        loop_thread.run(run())
        expected = [(len(p) // 16, len(p) // 16) for p in batch]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            views = [[cached_blocks(c, p) for p in batch] for c in (first, second)]
            if views == [expected, expected]:
                break
            time.sleep(0.1)
        assert views == [expected, expected]
    finally:
        loop_thread.run(second.close(kill_workers=False))
