"""`ClusterAdmin` over engines in this process: what the front-door tests (and a laptop
`LocalBackend` setup) manage instead of a Ray cluster. Not a cluster controller: no
restarts, no placement, no routing between pools."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidRequestError
from core.request import OutputDelta
from core.roles import WorkerRole
from router.frontdoor.admin_api import (
    ClusterState,
    PoolInfo,
    WorkerStateName,
    WorkerStatus,
    check_scale_args,
)
from router.frontdoor.backend import Backend, GenerateRequest


class InProcessWorker:
    """One in-process engine as a pool member; also a `Backend` that counts prefix hits."""

    def __init__(self, worker_id: str, role: str, backend: Backend) -> None:
        self.worker_id = worker_id
        self.role = role
        self.backend = backend
        self.state: WorkerStateName = "ready"
        self.model_name = backend.model_name
        self.max_model_len = backend.max_model_len
        self.tokenizer = getattr(backend, "tokenizer", None)
        self.num_active = 0

    async def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        self.num_active += 1
        try:
            async for out in self.backend.generate(request):
                yield out
        finally:
            self.num_active -= 1

    def is_ready(self) -> bool:
        return self.state == "ready" and self.backend.is_ready()

    async def status(self) -> WorkerStatus:
        load = None
        engine = getattr(self.backend, "engine", None)  # LocalBackend's AsyncEngine
        if engine is not None and self.state != "dead":
            load = await engine.call(lambda e: e.load(), timeout_s=5.0)
        return WorkerStatus.of(self.worker_id, self.role, self.state, load)

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


@dataclass
class _Pool:
    name: str
    desired_size: int
    workers: list[InProcessWorker] = field(default_factory=list)


class InProcessAdmin:
    """`ClusterAdmin` over engines in this process, for tests and `LocalBackend` setups.

    `make_backend(pool, worker_id)` builds a worker's engine (a `LocalBackend`). Scaling up
    builds workers at once; scaling down and `drain` mark workers draining, and a background
    task closes each once it has no request in flight. Not a cluster controller: no
    restarts, no placement, no routing between pools.
    """

    def __init__(
        self,
        make_backend: Callable[[str, str], Backend],
        pools: dict[str, int],
        drain_poll_s: float = 0.05,
    ) -> None:
        for name in pools:
            WorkerRole.parse(name)
        self._make_backend = make_backend
        self._pools = {name: _Pool(name, 0) for name in pools}
        self._ids = itertools.count()
        self._drain_poll_s = drain_poll_s
        self._drains: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self.autoscale_history: list[dict[str, Any]] = []
        """What `state()` reports as the autoscaler's last decisions (a test sets it)."""
        for name, size in pools.items():
            self._pools[name].desired_size = size
            for _ in range(size):
                self._start_worker(self._pools[name])

    def adopt(self, pool: str, backend: Backend) -> InProcessWorker:
        """Add an existing engine to `pool` (e.g. the one the front door serves from)."""
        p = self._pools[pool]
        worker = InProcessWorker(f"{pool}-{next(self._ids)}", pool, backend)
        p.workers.append(worker)
        p.desired_size += 1
        return worker

    def workers(self, pool: str) -> list[InProcessWorker]:
        return list(self._pools[pool].workers)

    async def state(self) -> ClusterState:
        pools = []
        for p in self._pools.values():
            infos = [await w.status() for w in p.workers]
            pools.append(PoolInfo(p.name, p.desired_size, tuple(infos)))
        return ClusterState(tuple(pools), tuple(self.autoscale_history))

    async def scale(self, pool: str, size: int) -> None:
        check_scale_args(pool, size, list(self._pools))
        async with self._lock:
            p = self._pools[pool]
            p.desired_size = size
            live = [w for w in p.workers if w.state in ("starting", "ready")]
            for _ in range(size - len(live)):
                # Building an engine loads weights: keep the event loop serving meanwhile.
                worker = self._start_worker(p, starting=True)
                worker.backend = await asyncio.to_thread(self._make_backend, pool, worker.worker_id)
                worker.state = "ready"
            for worker in live[size:]:
                self._begin_drain(worker)

    async def drain(self, worker_id: str) -> None:
        worker = next(
            (w for p in self._pools.values() for w in p.workers if w.worker_id == worker_id),
            None,
        )
        if worker is None:
            raise InvalidRequestError(f"unknown worker {worker_id!r}")
        if worker.state in ("starting", "ready"):
            p = self._pools[worker.role]
            p.desired_size = max(0, p.desired_size - 1)
            self._begin_drain(worker)

    def close(self) -> None:
        for task in self._drains:
            task.cancel()
        for p in self._pools.values():
            for w in p.workers:
                w.close()
            p.workers.clear()

    def _start_worker(self, pool: _Pool, starting: bool = False) -> InProcessWorker:
        worker_id = f"{pool.name}-{next(self._ids)}"
        backend = _Placeholder() if starting else self._make_backend(pool.name, worker_id)
        worker = InProcessWorker(worker_id, pool.name, backend)
        worker.state = "starting" if starting else "ready"
        pool.workers.append(worker)
        return worker

    def _begin_drain(self, worker: InProcessWorker) -> None:
        worker.state = "draining"
        task = asyncio.get_running_loop().create_task(self._finish_drain(worker))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _finish_drain(self, worker: InProcessWorker) -> None:
        while worker.num_active > 0:
            await asyncio.sleep(self._drain_poll_s)
        worker.state = "dead"
        await asyncio.to_thread(worker.close)
        pool = self._pools[worker.role]
        if worker in pool.workers:
            pool.workers.remove(worker)


class _Placeholder:
    """The backend of a worker whose engine is still being built."""

    model_name = ""
    max_model_len = 0

    def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        raise RuntimeError("worker is starting")

    def is_ready(self) -> bool:
        return False
