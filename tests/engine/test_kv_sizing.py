"""The KV cache's share of a GPU (engine/kv_cache/sizing.py): the arithmetic, its edges,
and the error that names the flag and every term."""

from __future__ import annotations

import pytest

from core.config import EngineConfig
from engine.kv_cache.sizing import DeviceUsage, KVCacheSizeError, describe, size_kv_cache

GIB = 1 << 30
BLOCK = 2 * 16 * 8 * 128 * 2 * 32  # K+V x 16 tokens x 8 heads x 128 dims x bf16 x 32 layers


def usage(total: int = 80 * GIB, weights: int = 15 * GIB, activation: int = 2 * GIB,
          non_torch: int = GIB // 2) -> DeviceUsage:  # fmt: skip
    return DeviceUsage(total, weights, activation, non_torch, num_profile_tokens=8192)


def test_the_cache_takes_what_is_left_of_the_share() -> None:
    size = size_kv_cache(usage(), 0.9, BLOCK)
    left = int(80 * GIB * 0.9) - (15 * GIB + 2 * GIB + GIB // 2)
    assert size.budget_bytes == int(80 * GIB * 0.9)
    assert size.num_blocks == left // BLOCK
    assert 0 <= left - size.kv_bytes < BLOCK


def test_a_larger_share_gives_more_blocks_and_all_of_it_is_allowed() -> None:
    blocks = [size_kv_cache(usage(), u, BLOCK).num_blocks for u in (0.5, 0.9, 1.0)]
    assert blocks == sorted(blocks) and len(set(blocks)) == 3
    assert size_kv_cache(usage(), 1.0, BLOCK).budget_bytes == 80 * GIB


def test_exactly_one_block_fits_one_byte_less_does_not() -> None:
    used = 15 * GIB + 2 * GIB + GIB // 2
    exact = usage(total=used + BLOCK)
    assert size_kv_cache(exact, 1.0, BLOCK).num_blocks == 1
    with pytest.raises(KVCacheSizeError):
        size_kv_cache(usage(total=used + BLOCK - 1), 1.0, BLOCK)


def test_no_room_names_the_flag_and_every_number() -> None:
    # 0.2 x 80 GiB = 16 GiB, less than the weights alone.
    with pytest.raises(KVCacheSizeError) as err:
        size_kv_cache(usage(), 0.2, BLOCK)
    message = str(err.value)
    for part in (
        "--gpu-memory-utilization 0.2",
        "16.00 GiB of the device's 80.00 GiB",
        "weights 15.00 GiB",
        "activation peak 2.00 GiB (8192 tokens)",
        "outside torch 0.50 GiB",
        "use 17.50 GiB",
        "leaving -1.50 GiB",
        f"one block needs {BLOCK} bytes",
        "--kv-cache-gb",
        "--max-num-batched-tokens",
    ):
        assert part in message, (part, message)


def test_the_graphs_pool_is_counted_and_named() -> None:
    pool = GIB // 4
    graphs = DeviceUsage(80 * GIB, 15 * GIB, 2 * GIB, GIB // 2, 8192, graph_pool_bytes=pool)
    left = size_kv_cache(usage(), 0.9, BLOCK).kv_bytes - size_kv_cache(graphs, 0.9, BLOCK).kv_bytes
    assert pool <= left < pool + BLOCK
    with pytest.raises(KVCacheSizeError, match=r"CUDA graphs 0\.25 GiB.*use 17\.75 GiB"):
        size_kv_cache(graphs, 0.2, BLOCK)


def test_a_draft_models_room_is_set_aside_and_named() -> None:
    draft = 3 * GIB
    plain, with_draft = usage(), DeviceUsage(80 * GIB, 15 * GIB, 2 * GIB, GIB // 2, 8192, draft)
    assert size_kv_cache(plain, 0.9, BLOCK).num_blocks - size_kv_cache(
        with_draft, 0.9, BLOCK
    ).num_blocks in (draft // BLOCK, draft // BLOCK + 1)
    with pytest.raises(
        KVCacheSizeError, match=r"set aside \(a draft model, landing areas\) 3\.00 GiB"
    ):
        size_kv_cache(with_draft, 0.22, BLOCK)


def test_the_log_line_shows_the_sum() -> None:
    size = size_kv_cache(usage(), 0.9, BLOCK)
    line = describe(usage(), 0.9, size)
    assert line.startswith(f"KV cache {size.kv_bytes / GIB:.2f} GiB = {size.num_blocks} blocks")
    assert "0.9 x 80.00 GiB = 72.00 GiB, less weights 15.00 GiB" in line


@pytest.mark.parametrize("utilization", [0.0, -0.1, 1.01])
def test_the_engine_config_refuses_a_share_outside_0_1(utilization: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=utilization)


def test_by_default_the_kv_size_is_left_to_the_device() -> None:
    config = EngineConfig()
    assert config.kv_cache_memory_bytes is None and config.gpu_memory_utilization == 0.9


def test_a_shared_gpu_holds_a_worker_to_what_was_free_when_it_began() -> None:
    # Half of an 80 GiB GPU at 0.9: 36 GiB, unless others held more than their part when the
    # worker began: then what was free, less the 8 GiB margin, is its share at most.
    roomy = DeviceUsage(80 * GIB, 15 * GIB, 2 * GIB, GIB // 2, 8192, shared_cap_bytes=60 * GIB)
    assert size_kv_cache(roomy, 0.45, BLOCK).budget_bytes == int(80 * GIB * 0.45)
    crowded = DeviceUsage(80 * GIB, 15 * GIB, 2 * GIB, GIB // 2, 8192, shared_cap_bytes=20 * GIB)
    assert size_kv_cache(crowded, 0.45, BLOCK).budget_bytes == 20 * GIB
    gone = DeviceUsage(80 * GIB, 15 * GIB, 2 * GIB, GIB // 2, 8192, shared_cap_bytes=-GIB)
    with pytest.raises(KVCacheSizeError, match="other processes on the shared GPU held the rest"):
        size_kv_cache(gone, 0.45, BLOCK)
