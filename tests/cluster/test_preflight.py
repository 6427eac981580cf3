"""The preflight on a real local Ray cluster (core/preflight.py): a decode pool that cannot
go on from the prefill pool's KV (here: it serves LoRA adapters the prefill pool does not) is
refused at start-up, naming the field, long before any request could time out; pools that
differ only where the KV does not care start and serve (pools of unlike layouts:
tests/cluster/test_unlike_pools.py)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import replace

import pytest

from core.config import EngineConfig
from core.sampling import SamplingParams
from tests import oracle
from tests.cluster.conftest import MAX_TOKENS, always_disaggregate, make_spec
from tests.cluster.helpers import collect

pytestmark = pytest.mark.slow
ENGINE = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512)
REFUSED_WITHIN_S = 120.0
"""Both tiny workers load in seconds; a request would wait minutes before timing out."""


async def _members_then_stop(name: str) -> tuple[list, dict[str, str]]:
    """The controller's members and refusals, then the controller and its workers stopped."""
    import ray

    controller = ray.get_actor(name)
    try:
        _, members = await controller.get_members.remote()
        refused = await controller.get_refused.remote()
        for pool in refused:  # scaling a refused pool is refused too, saying why
            with pytest.raises(ValueError, match=f"pool {pool} is not started: the preflight"):
                await controller.scale.remote(pool, 2)
    finally:
        await controller.shutdown.remote()
        ray.kill(controller, no_restart=True)
    return members, refused


@pytest.mark.parametrize(
    ("field", "decode_engine", "said"),
    [
        (
            "max_lora_rank",
            replace(ENGINE, max_loras=2, max_lora_rank=8),
            r"has 0, decode decode-\d+ has 8 ",
        )
    ],
)
def test_an_unlike_decode_pool_is_refused_at_start_up_naming_the_field(
    cluster_factory, loop_thread, tiny_model_dir, field: str, decode_engine: EngineConfig, said: str
) -> None:
    name = f"ctl-preflight-{os.urandom(3).hex()}"
    spec = make_spec(tiny_model_dir("llama"), engine=ENGINE, decode_engine=decode_engine)
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as refused:
            cluster_factory(spec, always_disaggregate(), name=name)
    finally:
        members, refused_pools = loop_thread.run(_members_then_stop(name), timeout=60)
    assert time.monotonic() - started < REFUSED_WITHIN_S
    message = str(refused.value)
    assert message.startswith("the preflight refuses worker ")
    assert re.search(rf"{field} differs: prefill prefill-\d+ {said}", message), message
    assert "adapters: a request's adapter must run on both workers" in message
    # The worker refused is stopped, not admitted; the one it was checked against stays.
    assert [m.state for m in members] == ["ready"]
    refused_id = message.split()[4].rstrip(":")
    assert refused_id not in {m.worker_id for m in members}
    # The controller keeps why (the admin API's cluster state says it), and that pool only.
    assert refused_pools == {refused_id.split("-")[0]: message}


def test_pools_that_differ_where_the_kv_does_not_care_start_and_serve(
    cluster_factory, loop_thread, tiny_model_dir
) -> None:
    model_dir = tiny_model_dir("llama")
    spec = make_spec(
        model_dir, engine=ENGINE, decode_engine=replace(ENGINE, max_num_seqs=8, seed=3)
    )
    cluster = cluster_factory(spec, always_disaggregate())
    prompt = [5, 17, 99, 3, 250, 41, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    out = loop_thread.run(collect(cluster.backend, "p0", prompt, greedy))
    assert out.token_ids == oracle.hf_greedy(str(model_dir), tuple(prompt), MAX_TOKENS)
    assert cluster.backend.transfers.num_transfers == 1
