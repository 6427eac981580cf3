"""What every worker actor shares: one engine on its own thread, one KV transport, and the
reports the router reads (KV events, load).

Kept in `decode_worker` because a decode worker is the general case (it can also prefill
for itself); the prefill worker builds on it. Plain Python: the controller wraps these
classes with `ray.remote` when it starts them (Ray appears only where actors start).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from core.config import EngineConfig
from core.events import KVEventBatch, WorkerLoad
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything needed to start one worker; built by the controller."""

    worker_id: str
    role: str
    """prefill | decode | unified (the engine role is unified for decode workers, so they
    can also prefill for themselves: conditional disaggregation)."""
    model_dir: str
    engine: EngineConfig = field(default_factory=EngineConfig)
    transport: str = "auto"
    num_threads: int = 1


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    role: str
    model_id: str
    block_size: int
    num_kv_blocks: int
    max_model_len: int
    transport_backend: str
    transport_metadata: bytes
    pid: int
    kv_bytes_per_block: int = 0
    """Bytes of one block over all layers (what a transfer moves per block)."""


@dataclass(frozen=True)
class WorkerReport:
    """Polled by the front door: the KV events since the last poll, and the load."""

    events: KVEventBatch | None
    load: WorkerLoad
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    """Prefix-cache hit totals since start (the worker's hit rate is their ratio)."""


def pin_threads(num_threads: int) -> None:
    """Share the machine sanely: a fixed, small number of threads per worker process."""
    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    torch.set_num_threads(num_threads)


class WorkerBase:
    engine_role = "unified"

    def __init__(self, spec: WorkerSpec) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        pin_threads(spec.num_threads)
        self.spec = spec
        self.worker_id = spec.worker_id
        start = time.monotonic()
        config = EngineConfig(**{**spec.engine.__dict__, "role": self.engine_role})
        self.llm = LLMEngine(Path(spec.model_dir), config, worker_id=spec.worker_id)
        self.engine = AsyncEngine(self.llm)
        self.transport = self._make_transport(spec.transport)
        self.num_prompt_tokens = 0
        self.num_cached_prompt_tokens = 0
        self.draining = False
        logger.info("worker %s (%s) ready in %.1f s", spec.worker_id, spec.role, time.monotonic() - start)

    def _make_transport(self, backend: str):  # noqa: ANN202 - kv_transfer.Transport
        from kv_transfer import KVCacheSpec, create_transport

        shape = self.llm.runner.kv_shape
        spec = KVCacheSpec(
            num_layers=shape.num_layers,
            num_blocks=shape.num_blocks,
            block_size=shape.block_size,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=str(shape.dtype).removeprefix("torch."),
        )
        return create_transport(
            self.llm.runner.kv_cache,
            spec,
            self.llm.model_config.model_id,
            backend=backend,
            name=self.worker_id,
            on_failure=self._on_transfer_failure,
            loopback=True,
        )

    def _on_transfer_failure(self, result) -> None:  # noqa: ANN001 - kv_transfer.TransferResult
        """A transfer failed on the transport's thread: free the request's blocks on the
        engine thread (the only thread that touches the engine)."""
        logger.warning("%s: transfer of %s failed: %s", self.worker_id, result.request_id, result.error)
        self.engine.submit(lambda e: e.abort(result.request_id))

    # -- actor methods shared by both kinds --------------------------------------------------
    def info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.worker_id,
            role=self.spec.role,
            model_id=self.llm.model_config.model_id,
            block_size=self.llm.config.block_size,
            num_kv_blocks=self.llm.kv.pool.num_blocks,
            max_model_len=self.llm.max_model_len,
            transport_backend=self.transport.backend,
            transport_metadata=self.transport.local_metadata(),
            pid=os.getpid(),
            kv_bytes_per_block=self.llm.runner.kv_shape.bytes_per_block_all_layers,
        )

    def connect(self, peer_metadata: bytes) -> str:
        return self.transport.add_peer(peer_metadata)

    def disconnect(self, peer: str) -> None:
        self.transport.remove_peer(peer)

    async def report(self) -> WorkerReport:
        def collect(e: LLMEngine) -> tuple[KVEventBatch | None, WorkerLoad]:
            return e.take_kv_events(), e.load()

        events, load = await self.engine.call(collect)
        return WorkerReport(events, load, self.num_prompt_tokens, self.num_cached_prompt_tokens)

    async def snapshot(self) -> KVEventBatch:
        return await self.engine.call(lambda e: e.kv_snapshot())

    async def abort(self, request_id: str) -> bool:
        self.transport.cancel(request_id)

        return await self.engine.call(lambda e: e.abort(request_id))

    def ping(self) -> str:
        return self.worker_id

    async def drain(self, timeout_s: float = 60.0) -> int:
        """Stop admitting, wait for running requests to finish; returns how many were left
        when the timeout hit (0: clean)."""
        import asyncio

        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            left = await self.engine.call(lambda e: e.scheduler.num_unfinished + len(e._held))
            if left == 0:
                return 0
            await asyncio.sleep(0.05)
        return await self.engine.call(lambda e: e.scheduler.num_unfinished + len(e._held))

    def account_prompt(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self.num_prompt_tokens += num_prompt_tokens
        self.num_cached_prompt_tokens += num_cached_tokens

    def shutdown(self) -> None:
        self.engine.stop()
        self.transport.close()
