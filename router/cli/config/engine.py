"""The engine group: how each worker's engine runs (device, threads, KV-cache memory, batch
caps, CUDA graphs, speculative decoding). These reach every worker as its EngineConfig
(core/config.py) and ClusterSpec (router/cluster/spec.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from core.config import EngineConfig
from router.cli.config.knob import default_of, knob
from router.cluster.spec import ClusterSpec


def parse_nice(value: str) -> int | None:
    """A nice value from -20 to 19, or `none` (leave the threads' priority alone)."""
    if value.lower() == "none":
        return None
    try:
        nice = int(value)
    except ValueError:
        nice = None
    if nice is None or not -20 <= nice <= 19:
        raise argparse.ArgumentTypeError(f"a nice value from -20 to 19, or none; got {value!r}")
    return nice


@dataclass(frozen=True)
class EngineOptions:
    TITLE: ClassVar[str] = "engine"
    ABOUT: ClassVar[str] = "each worker's engine: device, threads, KV-cache memory, batch caps"

    device: str = knob(
        default_of(EngineConfig, "device"),
        "cpu, cuda or auto (cuda where torch sees one)",
        metavar="DEVICE",
    )
    threads: int = knob(
        default_of(ClusterSpec, "num_threads"),
        "torch threads per worker (CPU)",
        minimum=1,
        metavar="N",
    )
    engine_nice: int | None = knob(
        default_of(ClusterSpec, "engine_nice"),
        "nice value of each CPU worker's compute threads (e.g. -10; the worker's other threads "
        "get 10 more): the front door's and I/O threads' work waits for the engine's gaps "
        "instead of stalling it; faster tokens, later first tokens where they share cores "
        "(worker/threads.py). Below 0 needs CAP_SYS_NICE",
        metavar="N|none",
        parse=parse_nice,
        default_doc="none (Ray's priority)",
    )
    cpu_bind: bool = knob(
        default_of(ClusterSpec, "cpu_bind"),
        "bind each CPU worker's compute threads to a CPU each, the CPUs fewest of this host's "
        "workers hold first (worker/cpu_claims.py); --no-cpu-bind: the kernel places them",
    )
    kv_cache_gb: float | None = knob(
        None,
        "KV cache per worker (per TP rank), GiB",
        default_doc="on CUDA what --gpu-memory-utilization leaves after the weights and a "
        "profiling forward; on CPU 1",
        metavar="GIB",
    )
    gpu_memory_utilization: float = knob(
        default_of(EngineConfig, "gpu_memory_utilization"),
        "share of each GPU a worker fills with weights, activations, CUDA graphs and KV cache, "
        "when --kv-cache-gb is not given",
        metavar="F",
    )
    kv_offload_host_gb: float = knob(
        0.0,
        "a host-memory tier under each worker's prefix cache (per TP rank), GiB: evicted KV "
        "blocks spill there and come back on a later hit instead of being recomputed",
        minimum=0,
        default_doc="0 (none)",
        metavar="GIB",
    )
    kv_offload_disk_gb: float = knob(
        0.0,
        "a local-disk tier under the host tier (per TP rank), GiB",
        minimum=0,
        default_doc="0 (none)",
        metavar="GIB",
    )
    kv_offload_dir: str | None = knob(
        default_of(EngineConfig, "kv_offload_dir"),
        "where the disk tier's file goes (unlinked at once)",
        metavar="DIR",
        default_doc="the temp directory",
    )
    max_num_seqs: int = knob(
        default_of(EngineConfig, "max_num_seqs"),
        "cap on a worker's running sequences (`vllm serve`'s on CPU): past saturation a larger "
        "batch reads the weights once for more tokens",
        minimum=1,
        metavar="N",
    )
    max_num_batched_tokens: int = knob(
        default_of(EngineConfig, "max_num_batched_tokens"),
        "token budget of one engine step: chunked prefill splits prompts to fit it",
        minimum=1,
        metavar="N",
    )
    cuda_graphs: bool = knob(
        default_of(EngineConfig, "cuda_graphs"),
        "replay every step from CUDA graphs captured at start-up: decode-only steps by batch "
        "size up to --max-num-seqs, the others by token count up to --max-num-batched-tokens "
        "(CUDA workers with the Triton kernels; never on CPU); --no-cuda-graphs runs every "
        "step eagerly (vLLM's --enforce-eager)",
    )
    overlap_steps: bool = knob(
        True,
        "launch each engine step before the last one's tokens are processed, so the host's "
        "scheduling and output work overlaps the device's (CUDA workers; never on CPU, "
        "whose kernels run on the host); --no-overlap-steps finishes every step first",
    )
    speculative: str | None = knob(
        default_of(EngineConfig, "speculative"),
        "speculative decoding on the decode workers (output unchanged): ngram, by prompt "
        "lookup (faster where answers repeat the prompt); draft, from the smaller checkpoint "
        "--speculative-model",
        choices=("ngram", "draft"),
        default_doc="off",
    )
    speculative_model: str | None = knob(
        default_of(EngineConfig, "speculative_model"),
        "with --speculative draft: the draft model's HF folder (same tokenizer; the same path "
        "on every decode node)",
        metavar="DIR",
    )
    num_speculative_tokens: int = knob(
        default_of(EngineConfig, "num_speculative_tokens"),
        "drafts per request per step",
        minimum=1,
        metavar="N",
    )
