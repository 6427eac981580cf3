"""How many KV blocks a GPU worker gets when no `--kv-cache-gb` is given (vLLM's
`--gpu-memory-utilization`): what is left of its share of the device once the weights, the
largest step's activations and everything outside torch's allocator are counted.

    total x utilization       this worker's share of the device (on a GPU shared by parts,
                              at most what was free when it began, less the margin)
  - weights                   torch memory after loading
  - activation peak           a forward at max_num_batched_tokens, above weights + its cache
  - outside torch             CUDA context, NCCL buffers, other processes (total - free -
                              what torch's allocator has reserved)
  - graph pool                the CUDA graphs' own memory, which eager steps cannot use:
                              the largest recorded step's forward (the profile's, sampler
                              left out), where the worker records graphs
  - set aside                 a draft model's weights and cache (--speculative draft), a
                              decode worker's landing areas: allocated later
  = KV cache bytes            // bytes of one block in every layer -> blocks

Pure arithmetic on numbers `engine/memory_profile.py` measures; no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

UTILIZATION_FLAG = "--gpu-memory-utilization"


class KVCacheSizeError(ValueError):
    """The device has no room for even one KV block under the configured utilization."""


@dataclass(frozen=True)
class DeviceUsage:
    """What one worker's device holds besides the KV cache, measured after loading."""

    total_bytes: int
    weights_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    num_profile_tokens: int
    """Tokens of the profiling forward that gave `activation_peak_bytes`."""
    reserved_bytes: int = 0
    """What the worker allocates after its KV cache: a draft model's weights and cache, a
    decode worker's landing areas for an unlike prefill pool."""
    shared_cap_bytes: int | None = None
    """On a GPU shared by parts (gpu_fraction < 1): the most its share may be, from what was
    free when the worker began (before it loaded anything) less the margin the utilization
    keeps. Other processes holding more than their parts (a server not yet gone) leave it
    less: said here, not found by an out-of-memory error at the cache's allocation."""
    graph_pool_bytes: int = 0
    """The CUDA graphs' private memory pool, recorded after the KV cache is allocated (0:
    no graphs): the intermediates of the largest recorded step, which stay the graphs'
    while eager work (the sampler, eager steps) allocates its own."""


@dataclass(frozen=True)
class KVCacheSize:
    num_blocks: int
    block_bytes: int
    """Bytes of one block across all layers."""
    budget_bytes: int
    """total x utilization."""

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.block_bytes


def size_kv_cache(usage: DeviceUsage, utilization: float, block_bytes: int) -> KVCacheSize:
    """The blocks that fit in the worker's share of the device (`utilization` in (0, 1],
    as EngineConfig checks). Raises KVCacheSizeError, with every term, if not one does."""
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
    budget = int(usage.total_bytes * utilization)
    if usage.shared_cap_bytes is not None:
        budget = max(0, min(budget, usage.shared_cap_bytes))
    used = (
        usage.weights_bytes
        + usage.activation_peak_bytes
        + usage.non_torch_bytes
        + usage.graph_pool_bytes
        + usage.reserved_bytes
    )
    num_blocks = max(0, budget - used) // block_bytes
    if num_blocks < 1:
        capped = budget < int(usage.total_bytes * utilization)
        raise KVCacheSizeError(
            f"no room for the KV cache: {UTILIZATION_FLAG} {utilization:g} allows "
            f"{_gib(budget)} of the device's {_gib(usage.total_bytes)}"
            + (
                " (other processes on the shared GPU held the rest when this worker began)"
                if capped
                else ""
            )
            + ", and "
            f"{_terms(usage)} already use {_gib(used)}, leaving {_gib(budget - used)} "
            f"where one block needs {block_bytes} bytes. Raise {UTILIZATION_FLAG}, lower "
            "--max-num-batched-tokens, or set --kv-cache-gb"
        )
    return KVCacheSize(num_blocks=num_blocks, block_bytes=block_bytes, budget_bytes=budget)


def describe(usage: DeviceUsage, utilization: float, size: KVCacheSize) -> str:
    """One log line with every term of the sum."""
    return (
        f"KV cache {_gib(size.kv_bytes)} = {size.num_blocks} blocks: {utilization:g} x "
        f"{_gib(usage.total_bytes)} = {_gib(size.budget_bytes)}, less {_terms(usage)}"
    )


def _terms(usage: DeviceUsage) -> str:
    return (
        f"weights {_gib(usage.weights_bytes)}, activation peak "
        f"{_gib(usage.activation_peak_bytes)} ({usage.num_profile_tokens} tokens), outside "
        f"torch {_gib(usage.non_torch_bytes)}"
        + (f", CUDA graphs {_gib(usage.graph_pool_bytes)}" if usage.graph_pool_bytes else "")
        + (
            f", set aside (a draft model, landing areas) {_gib(usage.reserved_bytes)}"
            if usage.reserved_bytes
            else ""
        )
    )


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 30):.2f} GiB"
