"""What every worker actor shares: one engine (over `tp` ranks) on its own thread, one KV
transport per rank, and the reports the router reads (KV events, load).

At tp=1 the one rank (`worker.rank.WorkerRank`) lives in this actor; at tp>1 the
ranks are actors of the worker's placement group (`worker.ray_ranks`) driven in
lockstep by `engine.tp.TPEngine`. The worker never touches an engine directly: every call
runs on the engine thread through `EngineGroup` (see group.py), so the code below is the
same for both. Transfers are tracked per rank and aggregated (tracker.py).

Kept in `decode_worker` because a decode worker is the general case (it can also prefill
for itself); the prefill worker builds on it. Plain Python: the controller wraps these
classes with `ray.remote` when it starts them (Ray appears only where actors start).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from core.config import EngineConfig
from core.errors import WorkerFailedError
from core.events import KVEventBatch, WorkerLoad
from engine.async_engine import AsyncEngine
from kv_transfer import Role
from worker.group import (
    EngineGroup,
    LocalGroup,
    decode_group_metadata,
    encode_group_metadata,
)
from worker.rank import WorkerRank
from worker.tracker import Outcome, TransferTracker

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
    tp: int = 1
    """Tensor-parallel ranks (tp>1: rank actors in the placement group given to the
    worker, see ray_ranks.py)."""


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
    """worker.group.GroupMetadata: one transport handshake per rank."""
    pid: int
    tp: int = 1
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

    def __init__(self, spec: WorkerSpec, placement: Any = None) -> None:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        pin_threads(spec.num_threads)
        self.spec = spec
        self.worker_id = spec.worker_id
        start = time.monotonic()
        config = EngineConfig(
            **{**spec.engine.__dict__, "role": self.engine_role, "tp_size": spec.tp}
        )
        self.group: EngineGroup = self._start_ranks(spec, config, placement)
        self.facts = self.group.call_first("describe")
        self.rank_metadata: list[bytes] = self.group.call_each("kv_metadata")
        self.tracker = TransferTracker(spec.tp)
        self.engine = AsyncEngine(self.group)  # type: ignore[arg-type]
        self.engine.after_step.append(self._after_step)
        self.num_prompt_tokens = 0
        self.num_cached_prompt_tokens = 0
        self.draining = False
        logger.info("worker %s (%s, tp=%d) ready in %.1f s", spec.worker_id, spec.role, spec.tp,
                    time.monotonic() - start)  # fmt: skip

    @staticmethod
    def _start_ranks(spec: WorkerSpec, config: EngineConfig, placement: Any) -> EngineGroup:
        rank = functools.partial(
            WorkerRank, spec.model_dir, config, spec.worker_id, spec.transport, spec.num_threads
        )
        if spec.tp == 1:
            return LocalGroup(rank())  # the fast path: no extra process
        from engine.config import ModelConfig
        from engine.tp import TPEngine, check_tp_size
        from worker.ray_ranks import start_ray_ranks

        check_tp_size(ModelConfig.from_dir(spec.model_dir), spec.tp)
        ranks = start_ray_ranks(spec.tp, config.device, rank, placement)
        return TPEngine(spec.model_dir, config, spec.worker_id, ranks=ranks)

    # -- transfers (engine thread) -----------------------------------------------------------
    def _after_step(self) -> None:
        """Engine thread, after every step: collect each rank's finished transfers."""
        if not self.tracker.pending:
            return
        g = self.group
        cancel, done = self.tracker.feed(g.call_each("kv_poll"))
        for request_id in cancel:  # one rank failed: stop the others quickly
            g.call_each("kv_cancel", request_id)
        for outcome in done:
            self._on_transfer_done(outcome)
            self.tracker.resolve(outcome)

    def _on_transfer_done(self, outcome: Outcome) -> None:
        """Every rank reported on a request's transfer: act on all ranks at once."""
        if outcome.error is not None:
            logger.warning("%s: transfer of %s failed: %s", self.worker_id, outcome.request_id,
                           outcome.error)  # fmt: skip
            if outcome.role is Role.RECV:
                self.group.call_all("abort", outcome.request_id)  # frees the reservation

    # -- actor methods shared by both kinds --------------------------------------------------
    def info(self) -> WorkerInfo:
        f = self.facts
        return WorkerInfo(
            worker_id=self.worker_id,
            role=self.spec.role,
            model_id=f.model_id,
            block_size=f.block_size,
            num_kv_blocks=f.num_kv_blocks,
            max_model_len=f.max_model_len,
            transport_backend=f.transport_backend,
            transport_metadata=encode_group_metadata(self.worker_id, self.rank_metadata),
            pid=os.getpid(),
            tp=self.spec.tp,
        )

    async def connect(self, peer_metadata: bytes) -> str:
        """Connect each rank to the matching rank of a peer worker (same TP size only)."""
        meta = decode_group_metadata(peer_metadata, self.worker_id, self.spec.tp)
        await self.engine.call(lambda g: g.call_each("kv_add_peer", meta.ranks))
        return meta.worker_id

    async def disconnect(self, peer: str) -> None:
        await self.engine.call(lambda g: g.call_each("kv_remove_peer", peer))

    async def report(self) -> WorkerReport:
        events, load = await self.engine.call(lambda g: g.call_all("report_state"))
        return WorkerReport(events, load, self.num_prompt_tokens, self.num_cached_prompt_tokens)

    async def snapshot(self) -> KVEventBatch:
        return await self.engine.call(lambda g: g.call_all("kv_snapshot"))

    async def abort(self, request_id: str) -> bool:
        def abort(g: EngineGroup) -> bool:
            self.tracker.discard(request_id)
            return g.abort(request_id)

        return await self.engine.call(abort)

    def rank_actors(self) -> list[Any]:
        """The Ray actors of this worker's ranks (none at tp=1), for operators and tests."""
        return [r.actor for r in getattr(self.group, "ranks", []) if hasattr(r, "actor")]

    def ping(self) -> str:
        if self.group.broken:  # the controller then replaces this worker
            raise WorkerFailedError(f"{self.worker_id}: {self.group.broken}")
        if self.engine.error is not None:  # every step keeps failing
            raise WorkerFailedError(f"{self.worker_id}: engine failing: {self.engine.error}")
        return self.worker_id

    async def drain(self, timeout_s: float = 60.0) -> int:
        """Stop admitting, wait for running requests to finish; returns how many were left
        when the timeout hit (0: clean)."""
        import asyncio

        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            left = await self.engine.call(lambda g: g.call_first("num_in_flight"))
            if left == 0:
                return 0
            await asyncio.sleep(0.05)
        return await self.engine.call(lambda g: g.call_first("num_in_flight"))

    def account_prompt(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self.num_prompt_tokens += num_prompt_tokens
        self.num_cached_prompt_tokens += num_cached_tokens

    def shutdown(self) -> None:
        self.engine.stop()
        self.group.shutdown()
