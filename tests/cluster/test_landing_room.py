"""A decode pool laid out otherwise than its prefill pool lands that pool's KV in areas of
its layout (worker/landing.py), allocated when the first prefill worker connects: on a GPU
their room is kept out of the decode worker's KV cache, which is sized first. The launcher
tells a decode worker the prefill pool's layout (EngineConfig.landing_layout) only where the
two differ; the engine's sizing sets that room aside (tests/engine/test_memory_profile.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.config import EngineConfig
from router.cluster.spec import ClusterSpec
from tests.cluster.test_fractional_gpus import launched

ENGINE = EngineConfig()


@pytest.mark.parametrize(
    "spec,pool,told",
    [
        (ClusterSpec(model_dir="/m"), "decode", None),  # one layout for both pools
        (ClusterSpec(model_dir="/m", prefill_tp=2), "decode", (2, 16, "auto")),
        (ClusterSpec(model_dir="/m", prefill_engine=replace(ENGINE, block_size=32)), "decode",
         (1, 32, "auto")),
        (ClusterSpec(model_dir="/m", decode_engine=replace(ENGINE, kv_cache_dtype="int8")),
         "decode", (1, 16, "auto")),
        (ClusterSpec(model_dir="/m", prefill_engine=replace(ENGINE, block_size=32)), "prefill",
         None),  # it sends, it lands none
        (ClusterSpec(model_dir="/m", mode="unified"), "unified", None),
    ],
)  # fmt: skip
def test_a_decode_worker_is_told_an_unlike_prefill_pools_layout(monkeypatch, spec, pool, told):
    remote = launched(monkeypatch, spec, pool)
    assert remote.args[0].engine.landing_layout == told
