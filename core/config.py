"""Engine configuration: the knobs of one worker's engine, torch-free so the router and the
cluster controller can build and ship it."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.fair_share import FairShareConfig

CPU_KV_CACHE_BYTES = 1 << 30
"""The KV cache of a CPU worker when no size is given (there is no device to fill)."""
KV_CACHE_DTYPES = {"auto": None, "int8": "int8", "fp8": "float8_e4m3fn"}
"""`kv_cache_dtype` -> the cache's dtype name (None: the model's dtype)."""


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None
    """Blocks in the KV cache; None sizes it from `kv_cache_memory_bytes`."""
    kv_cache_memory_bytes: int | None = None
    """KV cache per worker (per TP rank). None: on CUDA what `gpu_memory_utilization` leaves
    after the weights and a profiling forward (engine/kv_cache/sizing.py); on CPU
    CPU_KV_CACHE_BYTES."""
    landing_layout: tuple[int, int, str] | None = None
    """(TP size, block size, kv_cache_dtype) of a prefill pool laid out otherwise, whose KV
    this decode worker lands in areas of that layout (worker/landing.py): their room is kept
    out of its KV cache (engine/memory_profile.py). Set by the cluster, not a flag."""
    gpu_memory_utilization: float = 0.9
    """Share of the device's total memory this worker may fill with weights, activations
    and KV cache when the KV size is not given (CUDA only; vLLM's default)."""
    gpu_fraction: float = 1.0
    """The part of its device this worker holds (Ray's fractional GPUs: a prefill and a
    decode worker on one GPU hold 0.5 each): it fills gpu_memory_utilization x this of the
    device's memory, and what the other workers there hold is theirs, not counted against
    its share (engine/memory_profile.py)."""
    max_num_seqs: int = 128
    """Cap on running sequences (`vllm serve`'s on CPU): past saturation a larger batch reads
    the weights once for more tokens."""
    max_num_batched_tokens: int = 2048
    """Token budget of one step: chunked prefill splits prompts to fit it."""
    max_model_len: int | None = None
    """Context cap; None: the model's max positions (and never more than the cache holds)."""
    enable_prefix_caching: bool = True
    kv_offload_host_bytes: int = 0
    """A host-memory tier under the prefix cache, per TP rank: evicted blocks spill there
    and come back on a later hit (engine/kv_cache/offload.py). 0: none."""
    kv_offload_disk_bytes: int = 0
    """A local-disk tier under the host tier, per TP rank. 0: none."""
    kv_offload_dir: str | None = None
    """Where the disk tier's file goes (unlinked at once); None: the temp directory."""
    dtype: str = "auto"
    """float32 | bfloat16 | float16 | auto (float32 on CPU, the checkpoint's dtype on GPU)."""
    speculative: str | None = None
    """"ngram": speculative decoding by prompt lookup; "draft": drafts from the smaller
    checkpoint `speculative_model` (engine/spec); None: off."""
    speculative_model: str | None = None
    """The draft checkpoint's folder (the draft method only; same tokenizer as the model)."""
    num_speculative_tokens: int = 4
    """Drafts per speculating request per step."""
    quantization: str | None = None
    """"int8": INT8 weight-only linear layers, quantized on load (engine/layers/quant.py);
    "w8a8": the same weights, and each GEMM's input rows quantized to int8 on the fly, so the
    products run on the CPU's int8 units (VNNI / AMX; CPU only)."""
    kv_cache_dtype: str = "auto"
    """auto (the model's dtype) | int8 | fp8 (e4m3): a quantized KV cache, each (token, head)
    with its own scale (engine/kv_cache/quant.py); every attention backend reads it."""
    device: str = "auto"
    attention_backend: str = "auto"
    """torch | triton | auto (triton on CUDA, torch on CPU; BATON_ATTENTION forces one)."""
    seed: int = 0
    num_threads: int | None = None
    """torch intra-op threads on CPU; None leaves torch's default."""
    tp_size: int = 1
    """Tensor-parallel ranks of this engine. A cluster's TP size is ClusterSpec.tp (per pool:
    `tp_of`); each worker sets its engine's from its own spec."""
    fair_share: FairShareConfig = field(default_factory=FairShareConfig)
    max_loras: int = 0
    """LoRA adapters resident at once (engine/lora): a step runs at most this many; 0 serves
    the base model only (no adapter weights are allocated)."""
    max_lora_rank: int = 16
    """The largest adapter rank served (every slot is allocated this wide)."""
    """How the waiting queue orders tenants (core/fair_share.py); priority always counts."""
    cuda_graphs: bool = True
    """Replay steps from CUDA graphs captured at start-up (CUDA devices with the Triton
    backend only; never on CPU): decode-only steps by batch size, every other step by token
    count. False runs every step eagerly (vLLM's --enforce-eager): slower steps, quicker
    start, no graph memory."""
    decode_graphs: bool = True
    """With cuda_graphs, also record the decode-only steps' graphs (a prefill worker's
    engine, whose steps are prompts, records only the token-count graphs)."""
    overlap_steps: bool | None = None
    """Launch each step before the last one's outputs are processed (engine/overlap.py):
    the host schedules, prepares and detokenizes while the device computes. None: on where
    the device runs asynchronously (CUDA), off on CPU, whose kernels run on the host."""

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if not 0 < self.gpu_fraction <= 1:
            raise ValueError(f"gpu_fraction must be in (0, 1], got {self.gpu_fraction}")
        if self.speculative not in (None, "ngram", "draft"):
            raise ValueError(f"speculative must be ngram, draft or None, got {self.speculative!r}")
        if (self.speculative == "draft") != (self.speculative_model is not None):
            raise ValueError(
                "speculative_model (the draft checkpoint) goes with speculative='draft', "
                f"and only with it; got speculative={self.speculative!r}, "
                f"speculative_model={self.speculative_model!r}"
            )
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}"
            )
        if self.quantization not in (None, "int8", "w8a8"):
            raise ValueError(f"quantization must be int8, w8a8 or None, got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {sorted(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.kv_offload_host_bytes < 0 or self.kv_offload_disk_bytes < 0:
            raise ValueError("kv_offload_host_bytes and kv_offload_disk_bytes must be >= 0")
        if self.kv_offload_disk_bytes and not self.kv_offload_host_bytes:
            raise ValueError("kv_offload_disk_bytes needs a host tier (kv_offload_host_bytes)")
        if self.kv_offload_host_bytes and not self.enable_prefix_caching:
            raise ValueError("KV offload tiers hold prefix-cache blocks: enable prefix caching")
        if self.max_loras < 0 or self.max_lora_rank < 1:
            raise ValueError(
                f"max_loras must be >= 0 and max_lora_rank >= 1, got {self.max_loras} and "
                f"{self.max_lora_rank}"
            )
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
