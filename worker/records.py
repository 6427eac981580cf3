"""What crosses a worker actor's boundary: how to start it, what it is once started, and
what it reports while it runs. Frozen dataclasses, pickled by Ray."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import EngineConfig
from core.events import KVEventBatch, WorkerLoad
from core.preflight import WorkerFacts
from core.roles import WorkerRole
from core.tracing import TracingConfig


@dataclass(frozen=True)
class WorkerSpec:
    """Everything needed to start one worker; built by the controller."""

    worker_id: str
    role: WorkerRole
    model_dir: str
    engine: EngineConfig = field(default_factory=EngineConfig)
    transport: str = "auto"
    num_threads: int = 1
    engine_nice: int | None = None
    """Nice value of the engine's compute threads on CPU (worker/threads.py); None: Ray's."""
    cpu_bind: bool = True
    """Bind each compute thread to a CPU of its own on CPU (worker/cpu_claims.py)."""
    tp: int = 1
    """Tensor-parallel ranks (tp>1: rank actors in the placement group given to the
    worker, see ray_ranks.py)."""
    local_cluster: bool = True
    """Every worker runs on this one machine (a local single-node Ray): the KV transport
    keeps UCX on loopback and needs no network backend. False on a multi-node cluster."""
    tracing: TracingConfig = field(default_factory=TracingConfig)
    """Where this worker exports its spans (core/tracing.py); off by default."""


@dataclass(frozen=True)
class WorkerInfo:
    """A started worker, as the controller and the front doors know it."""

    worker_id: str
    role: WorkerRole
    model_id: str
    vocab_size: int
    block_size: int
    num_kv_blocks: int
    max_model_len: int
    kv_bytes_per_block: int
    """Bytes one block holds over all layers and all TP ranks: what a transfer moves per
    block sent."""
    transport_backend: str
    transport_metadata: bytes
    """worker.group.GroupMetadata: one transport handshake per rank."""
    pid: int
    tp: int = 1
    facts: WorkerFacts | None = None
    """What its KV handoff depends on, for the controller's preflight (core/preflight.py);
    every worker sends them (None only in test doubles of a worker)."""


@dataclass(frozen=True)
class WorkerReport:
    """Polled by each front door: the KV-event batches after the ones it has, and the load."""

    events: list[KVEventBatch]
    load: WorkerLoad


@dataclass(frozen=True)
class KVReservation:
    """Where a prompt's KV goes on the worker that reserved it, as its sender needs to know:
    the sender's first `skip_blocks` blocks are cached here already (not sent), the rest go
    to `dst_block_ids`, one per sender block (the reservation's own blocks, or a landing
    area's when the sender is laid out otherwise: worker/landing.py)."""

    request_id: str
    num_cached_tokens: int
    """Prompt tokens this worker caches already."""
    skip_blocks: int
    dst_block_ids: list[int]
    num_blocks: int
    """Blocks reserved in this worker's own cache."""
