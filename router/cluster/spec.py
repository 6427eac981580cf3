"""What a cluster is asked to be: the controller's input, built from `baton serve` flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import EngineConfig
from core.roles import WorkerRole
from core.tracing import TracingConfig
from router.cluster.autoscale.policy import AutoscaleConfig


@dataclass(frozen=True)
class ClusterSpec:
    model_dir: str
    mode: str = "disaggregated"
    """disaggregated (prefill + decode pools) or unified (one pool doing both phases)."""
    num_prefill: int = 1
    num_decode: int = 1
    engine: EngineConfig = field(default_factory=EngineConfig)
    prefill_engine: EngineConfig | None = None
    decode_engine: EngineConfig | None = None
    """A pool's own engine configuration (None: `engine`). The pools may differ in block size
    and KV cache dtype (a decode worker lands an unlike prefill worker's KV:
    worker/landing.py); the preflight refuses a worker whose KV the other pool cannot take
    (core/preflight.py): the model's facts must be the same on both sides."""
    transport: str = "auto"
    num_threads: int = 1
    engine_nice: int | None = None
    """Nice value of every CPU worker's compute threads (worker/threads.py); None: Ray's."""
    cpu_bind: bool = True
    """Every CPU worker binds each compute thread to a CPU of its own (worker/cpu_claims.py)."""
    tp: int = 1
    """Tensor-parallel size of every worker, unless the pool's own size below is given: the
    one place a cluster's TP size is set (each worker's engine takes its own from it)."""
    prefill_tp: int | None = None
    decode_tp: int | None = None
    """Per-pool TP sizes (None: `tp`). They may differ: a decode worker takes each of its
    ranks' heads from the prefill ranks that hold them (worker/landing.py)."""
    device: str = "cpu"
    gpus_per_worker: float = 1.0
    """The part of a GPU each worker asks Ray for (a fractional `num_gpus`, CUDA only): at
    0.5 a prefill and a decode worker share one GPU, each filling half of its memory share
    (EngineConfig.gpu_fraction), and the KV moves between their processes over NIXL's CUDA
    IPC. A worker of several TP ranks takes whole GPUs."""
    redis_url: str | None = None
    local: bool = True
    """A local single-node Ray that `baton serve` started (False: it joined a cluster): the
    KV transport stays on loopback and needs no network backend."""
    worker_start_timeout_s: float = 180.0
    health_interval_s: float = 1.0
    health_timeout_s: float = 10.0
    autoscale: AutoscaleConfig | None = None
    """Size the pools to TTFT / ITL targets while serving (router/cluster/autoscale); off
    when None."""
    tracing: TracingConfig = field(default_factory=TracingConfig)
    """Where every process exports its request spans (`--otlp-traces-endpoint`): the front
    doors and each worker, each with its own exporter (core/tracing.py)."""

    def __post_init__(self) -> None:
        if self.mode not in ("disaggregated", "unified"):
            raise ValueError(f"mode must be disaggregated or unified, got {self.mode!r}")
        if self.num_decode < 1:
            raise ValueError("at least one decode (or unified) worker is needed")
        if self.num_prefill < 0:
            raise ValueError("the prefill pool size cannot be negative")
        sizes = {"tp": self.tp, "prefill_tp": self.prefill_tp, "decode_tp": self.decode_tp}
        for name, value in sizes.items():
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0 < self.gpus_per_worker <= 1:
            raise ValueError(f"gpus_per_worker must be in (0, 1], got {self.gpus_per_worker}")
        if self.gpus_per_worker < 1 and max(v or 1 for v in sizes.values()) > 1:
            raise ValueError(
                f"gpus_per_worker {self.gpus_per_worker} shares a GPU between workers; a "
                "worker of several TP ranks takes whole GPUs (set gpus_per_worker 1 or tp 1)"
            )

    def tp_of(self, pool: str) -> int:
        """The tensor-parallel size of a pool's workers."""
        own = {WorkerRole.PREFILL: self.prefill_tp, WorkerRole.DECODE: self.decode_tp}.get(pool)
        return own if own is not None else self.tp

    def engine_of(self, pool: str) -> EngineConfig:
        """The engine configuration of a pool's workers."""
        own = {WorkerRole.PREFILL: self.prefill_engine, WorkerRole.DECODE: self.decode_engine}
        engine = own.get(WorkerRole.parse(pool))
        return engine if engine is not None else self.engine

    def initial_pools(self) -> dict[WorkerRole, int]:
        if self.mode == "unified":
            return {WorkerRole.UNIFIED: self.num_decode + self.num_prefill}
        return {WorkerRole.PREFILL: self.num_prefill, WorkerRole.DECODE: self.num_decode}
