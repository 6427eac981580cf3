"""The profiling forward that sizes a GPU worker's KV cache: after loading, run the largest
step the scheduler can build (max_num_batched_tokens as one prefill chunk, through the real
model, attention backend and a sampler, on a small temporary cache), and read what it took.

Device memory is queried through `DeviceMemory`: `CudaMemory` asks torch.cuda; a test passes
its own numbers so that this same path runs on CPU.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import torch
from torch import nn

from core.config import KV_CACHE_DTYPES, EngineConfig
from core.kv_layout import KVLayout, dtype_name, landing_bytes
from core.sampling import SamplingParams
from engine.attention.backend import AttentionMetadata, PrefillChunk
from engine.kv_cache.manager import cdiv
from engine.kv_cache.sizing import DeviceUsage
from engine.kv_cache.tensor import allocate_kv_cache
from engine.parallel import SINGLE, TPGroup
from engine.sampler import Sampler, SamplingRow

# A filtered, random draw with logprobs: the sampler's most memory-hungry path.
_PROFILE_SAMPLING = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, logprobs=5)


class DeviceMemory(Protocol):
    """The memory queries KV sizing asks of a device."""

    def synchronize(self) -> None:
        """Wait for queued kernels, so that the numbers below include them."""

    def allocated_bytes(self) -> int:
        """Bytes in live torch tensors on the device."""

    def reset_peak(self) -> None: ...

    def peak_allocated_bytes(self) -> int:
        """Most bytes in live torch tensors at once since `reset_peak`."""

    def release_cached(self) -> None:
        """Hand memory torch's allocator caches but no tensor uses back to the device."""

    def total_and_non_torch_bytes(self) -> tuple[int, int]:
        """(the device's memory, bytes in use on it outside torch's allocator)."""

    def free_at_start_bytes(self) -> int | None:
        """On a device shared by parts, what was free when this worker began; else None."""


SHARED_OUTSIDE_BYTES = 3 << 29
"""On a shared device, the most of its non-torch bytes a worker counts as its own (its CUDA
context, cuBLAS workspaces and compiled kernels: ~0.5-1 GiB): the rest is the other
workers', who each count their own share."""


class CudaMemory:
    def __init__(self, device: torch.device, shared: bool = False) -> None:
        """`shared`: the device is shared with other workers, each with its own part
        (EngineConfig.gpu_fraction). What is in use on it before this worker allocates
        anything is theirs, and so is whatever they allocate while this one sizes its cache
        (they start together): this worker counts at most SHARED_OUTSIDE_BYTES of the
        memory outside its allocator."""
        self.device = device
        self.shared = shared
        self.others_bytes = 0
        self._free_at_start: int | None = None
        if shared:
            free, total = torch.cuda.mem_get_info(device)
            self.others_bytes = total - free - torch.cuda.memory_reserved(device)
            self._free_at_start = free + torch.cuda.memory_reserved(device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def allocated_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_allocated_bytes(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def release_cached(self) -> None:
        torch.cuda.empty_cache()

    def free_at_start_bytes(self) -> int | None:
        return self._free_at_start

    def total_and_non_torch_bytes(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.device)
        # Used but not reserved by torch: the CUDA context, NCCL, cuBLAS workspaces outside
        # the allocator, and any other process on this GPU (but those sharing it by parts).
        outside = total - free - torch.cuda.memory_reserved(self.device)
        if self.shared:
            outside = min(max(0, outside - self.others_bytes), SHARED_OUTSIDE_BYTES)
        return total, outside


def chunk_lengths(num_tokens: int, max_len: int) -> list[int]:
    """`num_tokens` as prefills of sequences no longer than `max_len` (one, unless the step
    budget exceeds the longest sequence the model takes)."""
    return [min(max_len, num_tokens - start) for start in range(0, num_tokens, max_len)]


@torch.inference_mode()
def measure_device_usage(
    model: nn.Module,
    layout: KVLayout,
    config: EngineConfig,
    max_model_len: int,
    vocab_size: int,
    memory: DeviceMemory,
    device: torch.device,
    tp: TPGroup = SINGLE,
    graphs: bool = False,
) -> DeviceUsage:
    """Run the largest step once and return what the device holds besides a KV cache.
    Every TP rank must call this together (the forward's collectives); each gets the worst
    of all ranks' numbers, so they all size the same cache. `layout`: the cache's geometry
    (its num_blocks is ignored). `graphs`: the worker records CUDA graphs after sizing; their
    pool is counted as the forward's own peak (the largest graph records this step)."""
    memory.synchronize()
    weights = memory.allocated_bytes()
    lengths = chunk_lengths(config.max_num_batched_tokens, max_model_len)
    num_blocks = sum(cdiv(n, layout.block_size) for n in lengths)
    kv_cache = allocate_kv_cache(replace(layout, num_blocks=num_blocks), device)
    input_ids, positions, meta = prefill_batch(lengths, layout.block_size, device)
    num_rows = min(config.max_num_seqs, config.max_num_batched_tokens)
    rows = [SamplingRow(_PROFILE_SAMPLING, (), ()) for _ in range(num_rows)]

    memory.synchronize()
    memory.reset_peak()
    before = memory.allocated_bytes()  # weights + the temporary cache
    hidden = model(input_ids, positions, kv_cache, meta)
    memory.synchronize()
    forward_peak = memory.peak_allocated_bytes() - before
    dtype = hidden.dtype  # the activations', which a draft model loads in
    # A sampler of its own: the engine's keeps its generator state untouched.
    Sampler(vocab_size, seed=0)(model.compute_logits(hidden[:num_rows]).float(), rows)
    memory.synchronize()
    activation_peak = memory.peak_allocated_bytes() - before

    del hidden, kv_cache, meta, input_ids, positions
    memory.release_cached()
    total, non_torch = memory.total_and_non_torch_bytes()
    free_at_start = memory.free_at_start_bytes()
    # The margin the utilization keeps, kept out of what was free too.
    cap = None if free_at_start is None else free_at_start - int(
        total * (1 - config.gpu_memory_utilization)
    )  # fmt: skip
    graph_pool = forward_peak if graphs else 0
    neg_total, weights, activation_peak, non_torch, graph_pool, neg_cap = tp.max_over_ranks(
        [-total, weights, activation_peak, non_torch, graph_pool, -(total if cap is None else cap)],
        device,
    )
    return DeviceUsage(
        total_bytes=-neg_total,
        weights_bytes=weights,
        activation_peak_bytes=activation_peak,
        non_torch_bytes=non_torch,
        graph_pool_bytes=graph_pool,
        num_profile_tokens=config.max_num_batched_tokens,
        reserved_bytes=_draft_bytes(config, max_model_len, dtype)
        + _landing_bytes(config, layout, max_model_len, dtype, model.config.num_key_value_heads),
        shared_cap_bytes=None if cap is None else -neg_cap,
    )


def _draft_bytes(config: EngineConfig, max_model_len: int, dtype: torch.dtype) -> int:
    """A draft model's weights and cache (`--speculative draft`), which load after the KV
    cache is sized and so must be left room for."""
    if config.speculative != "draft" or not config.speculative_model:
        return 0
    from engine.spec.draft_model import draft_device_bytes
    from engine.spec.speculator import MAX_BATCH

    return draft_device_bytes(
        config.speculative_model, dtype, MAX_BATCH, max_model_len, config.block_size
    )


def _landing_bytes(
    config: EngineConfig, layout: KVLayout, max_model_len: int, dtype: torch.dtype, heads: int
) -> int:
    """A decode worker's landing areas for an unlike prefill pool's KV (worker/landing.py),
    which it allocates when that pool's first worker connects: as many tokens as a prompt
    and a step's budget, in that pool's layout."""
    if config.landing_layout is None:
        return 0
    tp, block_size, cache_dtype = config.landing_layout
    name = KV_CACHE_DTYPES[cache_dtype] or dtype_name(dtype)
    tokens = max_model_len + config.max_num_batched_tokens
    return landing_bytes(layout, heads, tp, block_size, name, tokens)


def prefill_batch(
    lengths: list[int], block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """One prefill chunk per length, from position 0, on consecutive blocks of the cache."""
    positions = torch.cat([torch.arange(n) for n in lengths])
    prefills: list[PrefillChunk] = []
    slot_blocks: list[torch.Tensor] = []
    start = first_block = 0
    for n in lengths:
        block_ids = torch.arange(first_block, first_block + cdiv(n, block_size))
        prefills.append(PrefillChunk(start, n, n, block_ids.to(device)))
        slot_blocks.append(block_ids.repeat_interleave(block_size)[:n])
        start += n
        first_block += len(block_ids)
    positions = positions.to(device)
    meta = AttentionMetadata(
        block_size=block_size,
        slot_blocks=torch.cat(slot_blocks).to(device),
        slot_offsets=positions % block_size,
        num_decodes=0,
        decode_block_tables=torch.zeros((0, 0), dtype=torch.long, device=device),
        decode_seq_lens=torch.zeros(0, dtype=torch.long, device=device),
        prefills=prefills,
    )
    # Token 0: any id runs the same kernels; the values do not change the memory.
    input_ids = torch.zeros(sum(lengths), dtype=torch.long, device=device)
    return input_ids, positions, meta
