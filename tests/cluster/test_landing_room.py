"""A decode pool laid out otherwise than its prefill pool lands that pool's KV in areas of
its layout (worker/landing.py), allocated when the first prefill worker connects: on a GPU
their room is kept out of the decode worker's KV cache, which is sized first. The launcher
tells a decode worker the prefill pool's layout (EngineConfig.landing_layout) only where the
two differ, and the engine's sizing sets that room aside."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from core.config import EngineConfig
from core.kv_layout import landing_bytes
from engine.model_runner import ModelRunner
from router.cluster.spec import ClusterSpec
from tests.cluster.test_fractional_gpus import launched
from tests.engine.test_memory_profile import FakeMemory, block_bytes, model_config  # noqa: F401

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


def test_the_room_for_landing_is_kept_out_of_the_cache(model_config) -> None:  # noqa: F811
    # test_memory_profile's device: half of it holds everything measured plus 40.5 blocks.
    from tests.engine.test_memory_profile import ACTIVATION, NON_TORCH, WEIGHTS

    block = block_bytes(model_config)
    total = 2 * (WEIGHTS + ACTIVATION + NON_TORCH + 81 * block // 2)

    def runner(**config) -> ModelRunner:
        engine = EngineConfig(max_num_batched_tokens=600, max_num_seqs=8,
                              gpu_memory_utilization=0.5, **config)  # fmt: skip
        return ModelRunner(model_config, engine, torch.device("cpu"), torch.float32, "torch",
                           device_memory=FakeMemory(total, []))  # fmt: skip

    plain, landing = runner(), runner(landing_layout=(2, 16, "int8"))
    room = landing_bytes(plain.kv_layout, model_config.num_key_value_heads, 2, 16, "int8",
                         model_config.max_position_embeddings + 600)  # fmt: skip
    assert 0 < room < 40 * block
    assert landing.kv_layout.num_blocks == plain.kv_layout.num_blocks - -(-room // block)
