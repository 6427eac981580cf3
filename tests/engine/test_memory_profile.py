"""The profiling forward that sizes a GPU worker's KV cache (engine/memory_profile.py),
run on CPU: the real model, attention backend and sampler at the largest step, with the
device's memory numbers from a fake `DeviceMemory` (on CUDA, torch.cuda gives them)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.config import EngineConfig
from core.kv_layout import landing_bytes
from engine import cuda_graphs
from engine.config import ModelConfig
from engine.kv_cache.sizing import KVCacheSizeError
from engine.memory_profile import chunk_lengths
from engine.model_runner import ModelRunner
from engine.models.llama import LlamaModel
from engine.parallel import TPGroup

MIB = 1 << 20
WEIGHTS, TEMP_CACHE, ACTIVATION, NON_TORCH = 300 * MIB, 7 * MIB, 90 * MIB, 40 * MIB
FORWARD = 60 * MIB
"""The forward's own peak, the sampler's left out: what recorded graphs keep."""


class FakeMemory:
    """A device whose allocator holds the weights, then the temporary cache too, and peaks
    `FORWARD` above that in the forward, `ACTIVATION` once the sampler ran. Records the
    order of the queries in `calls`."""

    def __init__(self, total: int, calls: list[str]) -> None:
        self.total = total
        self.calls = calls
        self._allocated = iter([WEIGHTS, WEIGHTS + TEMP_CACHE])
        self._peaks = iter([WEIGHTS + TEMP_CACHE + FORWARD, WEIGHTS + TEMP_CACHE + ACTIVATION])

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def allocated_bytes(self) -> int:
        self.calls.append("allocated")
        return next(self._allocated)

    def reset_peak(self) -> None:
        self.calls.append("reset_peak")

    def peak_allocated_bytes(self) -> int:
        self.calls.append("peak")
        return next(self._peaks)

    def release_cached(self) -> None:
        self.calls.append("release_cached")

    def total_and_non_torch_bytes(self) -> tuple[int, int]:
        self.calls.append("total")
        return self.total, NON_TORCH

    def free_at_start_bytes(self) -> int | None:
        return None


@pytest.fixture
def forwards(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What every model forward was given."""
    seen: list[dict[str, Any]] = []
    real = LlamaModel.forward

    def recording(self, input_ids, positions, kv_cache, meta):  # type: ignore[no-untyped-def]
        seen.append(
            {
                "num_tokens": input_ids.shape[0],
                "max_position": int(positions.max()),
                "chunks": [(c.query_len, c.seq_len) for c in meta.prefills],
                "num_decodes": meta.num_decodes,
                "cache_blocks": kv_cache.shape[1],
            }
        )
        return real(self, input_ids, positions, kv_cache, meta)

    monkeypatch.setattr(LlamaModel, "forward", recording)
    return seen


@pytest.fixture
def model_config(tiny_model_dir) -> ModelConfig:
    return ModelConfig.from_dir(tiny_model_dir("llama", max_position_embeddings=256))


def runner(model_config: ModelConfig, memory: FakeMemory | None, **config: Any) -> ModelRunner:
    engine_config = EngineConfig(max_num_batched_tokens=600, max_num_seqs=8, **config)
    cpu = torch.device("cpu")
    return ModelRunner(
        model_config, engine_config, cpu, torch.float32, "torch", device_memory=memory
    )


def block_bytes(model_config: ModelConfig) -> int:
    # K and V x 16 tokens x KV heads x head_dim x float32, in every layer
    per_layer = 2 * 16 * model_config.num_key_value_heads * model_config.head_dim * 4
    return per_layer * model_config.num_hidden_layers


def test_the_cache_takes_what_the_largest_step_leaves(
    model_config: ModelConfig, forwards: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    block = block_bytes(model_config)
    # Half the device is the share; it holds everything measured plus 40.5 blocks.
    total = 2 * (WEIGHTS + ACTIVATION + NON_TORCH + 81 * block // 2)
    calls: list[str] = []
    with caplog.at_level(logging.INFO, logger="engine.model_runner"):
        run = runner(model_config, FakeMemory(total, calls), gpu_memory_utilization=0.5)

    # One forward: the 600-token step budget as prefills of at most the 256 positions the
    # model takes, on a temporary cache just big enough for them.
    assert forwards == [
        {
            "num_tokens": 600,
            "max_position": 255,
            "chunks": [(256, 256), (256, 256), (88, 88)],
            "num_decodes": 0,
            "cache_blocks": 16 + 16 + 6,
        }
    ]
    # Weights counted once loading's kernels are done; the peak reset after the temporary
    # cache is made and read once the forward's kernels are done, then the sampler's; the
    # device's total read after the temporary cache is given back.
    assert calls == [
        "synchronize", "allocated",
        "synchronize", "reset_peak", "allocated",
        "synchronize", "peak",
        "synchronize", "peak",
        "release_cached", "total",
    ]  # fmt: skip
    assert run.kv_layout.num_blocks == 40
    assert run.kv_cache.shape[1] == 40
    logged = caplog.text
    assert "KV cache" in logged and "= 40 blocks" in logged
    assert "weights 0.29 GiB" in logged and "activation peak 0.09 GiB (600 tokens)" in logged
    assert "CUDA graphs" not in logged  # none recorded on CPU


def test_recorded_graphs_are_left_the_forwards_peak(
    model_config: ModelConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that records CUDA graphs after sizing (a GPU, the Triton backend) leaves
    their pool the forward's own peak: the largest graph records that step, and its
    intermediates stay the graphs' while the sampler and eager steps allocate their own."""
    block = block_bytes(model_config)
    total = 2 * (WEIGHTS + ACTIVATION + NON_TORCH + FORWARD + 81 * block // 2)
    plain = runner(model_config, FakeMemory(total, []), gpu_memory_utilization=0.5)
    monkeypatch.setattr(cuda_graphs, "records_cuda_graphs", lambda *args: True)
    with caplog.at_level(logging.INFO, logger="engine.model_runner"):
        graphs = runner(model_config, FakeMemory(total, []), gpu_memory_utilization=0.5)
    assert graphs.kv_layout.num_blocks == 40
    assert plain.kv_layout.num_blocks - 40 in (FORWARD // block, -(-FORWARD // block))
    assert "CUDA graphs 0.06 GiB" in caplog.text


def test_no_room_for_a_block_is_an_error_naming_the_flag(
    model_config: ModelConfig, forwards: list[dict[str, Any]]
) -> None:
    total = WEIGHTS + ACTIVATION + NON_TORCH + block_bytes(model_config) - 1
    with pytest.raises(KVCacheSizeError, match="--gpu-memory-utilization 1"):
        runner(model_config, FakeMemory(total, []), gpu_memory_utilization=1.0)
    assert len(forwards) == 1


@pytest.mark.parametrize("given", ["num_kv_blocks", "kv_cache_memory_bytes"])
def test_a_given_size_wins_over_profiling(
    model_config: ModelConfig, forwards: list[dict[str, Any]], given: str
) -> None:
    value = 12 if given == "num_kv_blocks" else 12 * block_bytes(model_config)
    calls: list[str] = []
    run = runner(model_config, FakeMemory(1 << 40, calls), **{given: value})
    assert run.kv_layout.num_blocks == 12
    assert calls == [] and forwards == []


def test_chunk_lengths() -> None:
    assert chunk_lengths(2048, 4096) == [2048]
    assert chunk_lengths(4096, 4096) == [4096]
    assert chunk_lengths(5000, 2048) == [2048, 2048, 904]
    assert chunk_lengths(1, 1) == [1]


def _rank_max(rank: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        group = TPGroup(rank=rank, size=2)
        got = group.max_over_ranks([rank, -rank, 5, 10**12 + rank], torch.device("cpu"))
        assert got == [1, 0, 5, 10**12 + 1], got
    finally:
        dist.destroy_process_group()


def test_ranks_agree_on_the_worst_numbers(tmp_path: Path) -> None:
    """TP ranks reduce their measurements before sizing, so every rank gets the same
    number of blocks (their schedulers must stay in lockstep)."""
    mp.spawn(_rank_max, args=(str(tmp_path / "init"),), nprocs=2, join=True)


def test_a_worker_holding_part_of_the_device_fills_that_part(
    model_config: ModelConfig, forwards: list[dict[str, Any]]
) -> None:
    # The first test's device: half a GPU at utilization 1 is utilization 0.5 of a whole one.
    total = 2 * (WEIGHTS + ACTIVATION + NON_TORCH + 81 * block_bytes(model_config) // 2)
    run = runner(model_config, FakeMemory(total, []), gpu_memory_utilization=1.0, gpu_fraction=0.5)
    assert run.kv_layout.num_blocks == 40


@pytest.mark.parametrize("fraction", [0.0, 1.5])
def test_the_fraction_is_of_one_device(fraction: float) -> None:
    with pytest.raises(ValueError, match="gpu_fraction"):
        EngineConfig(gpu_fraction=fraction)


def test_a_shared_device_counts_only_this_workers_outside_memory(monkeypatch) -> None:
    """Two workers sizing their caches on one GPU at once: the other's weights, appearing
    while this one measures, are not this one's (torch.cuda's answers given here)."""
    from engine.memory_profile import SHARED_OUTSIDE_BYTES, CudaMemory

    gib = 1 << 30
    answers = {"free": 70 * gib, "reserved": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (answers["free"], 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: answers["reserved"])
    cpu = torch.device("cpu")
    shared, whole = CudaMemory(cpu, shared=True), CudaMemory(cpu)
    assert shared.others_bytes == 10 * gib  # another process, there before this one
    # This worker reserved 16 GiB; the other worker loaded 17 GiB meanwhile; 1 GiB is ours.
    answers.update(free=36 * gib, reserved=16 * gib)
    assert whole.total_and_non_torch_bytes() == (80 * gib, 28 * gib)
    assert shared.total_and_non_torch_bytes() == (80 * gib, SHARED_OUTSIDE_BYTES)
    answers.update(free=53 * gib, reserved=16 * gib)  # the other worker gone: 1 GiB, its own
    assert shared.total_and_non_torch_bytes() == (80 * gib, 1 * gib)
    # What was free when it began (its share's cap): for the shared one only.
    assert (shared.free_at_start_bytes(), whole.free_at_start_bytes()) == (70 * gib, None)


class CrowdedMemory(FakeMemory):
    """A shared device on which others held all but `free` when this worker began."""

    def __init__(self, total: int, free: int) -> None:
        super().__init__(total, [])
        self.free = free

    def free_at_start_bytes(self) -> int | None:
        return self.free


def test_a_shared_device_others_crowd_gives_what_was_free(model_config: ModelConfig) -> None:
    block = block_bytes(model_config)
    total = 2 * (WEIGHTS + ACTIVATION + NON_TORCH + 81 * block // 2)
    roomy = runner(model_config, CrowdedMemory(total, total), gpu_memory_utilization=1.0,
                   gpu_fraction=0.5)  # fmt: skip
    assert roomy.kv_layout.num_blocks == 40  # as the test above: its share
    # Others held all but the share's weights, activations, outside memory and 10 blocks.
    free = WEIGHTS + ACTIVATION + NON_TORCH + 10 * block
    crowded = runner(model_config, CrowdedMemory(total, free), gpu_memory_utilization=1.0,
                     gpu_fraction=0.5)  # fmt: skip
    assert crowded.kv_layout.num_blocks == 10


def test_a_draft_model_is_left_its_room(model_config: ModelConfig, tiny_model_dir) -> None:
    """The draft loads after the target's cache is sized: its weights and cache are set
    aside first, exactly what engine/spec/draft_model.py says it takes."""
    from engine.spec.draft_model import draft_device_bytes
    from engine.spec.speculator import MAX_BATCH

    block = block_bytes(model_config)
    draft_dir = str(tiny_model_dir("llama", num_hidden_layers=2, seed=5))
    draft = draft_device_bytes(draft_dir, torch.float32, MAX_BATCH, 256)
    total = 2 * (WEIGHTS + ACTIVATION + NON_TORCH + 81 * block // 2 + draft)
    plain = runner(model_config, FakeMemory(total, []), gpu_memory_utilization=0.5)
    spec = runner(model_config, FakeMemory(total, []), gpu_memory_utilization=0.5,
                  speculative="draft", speculative_model=draft_dir)  # fmt: skip
    assert spec.kv_layout.num_blocks == 40
    assert plain.kv_layout.num_blocks - 40 in (draft // block, -(-draft // block))


def test_the_room_for_landing_is_kept_out_of_the_cache(model_config) -> None:
    # A decode worker's landing areas for an unlike prefill pool (tests/cluster/
    # test_landing_room.py): the first test's device, half of it the share.
    block = block_bytes(model_config)
    total = 2 * (WEIGHTS + ACTIVATION + NON_TORCH + 81 * block // 2)
    plain = runner(model_config, FakeMemory(total, []), gpu_memory_utilization=0.5)
    landing = runner(model_config, FakeMemory(total, []), gpu_memory_utilization=0.5,
                     landing_layout=(2, 16, "int8"))  # fmt: skip
    room = landing_bytes(plain.kv_layout, model_config.num_key_value_heads, 2, 16, "int8",
                         model_config.max_position_embeddings + 600)  # fmt: skip
    assert 0 < room < 40 * block
    assert landing.kv_layout.num_blocks == plain.kv_layout.num_blocks - -(-room // block)
