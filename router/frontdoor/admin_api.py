"""The operator's view of the cluster: what the admin HTTP endpoints, the dashboard and the
gRPC `AdminService` call.

`ClusterAdmin` is the contract; the Ray pool controller implements it for a real cluster.
`InProcessAdmin` implements it over engines in this process (`LocalBackend`s): it is what
the tests and a laptop `LocalBackend` setup use, not a cluster controller.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from core.errors import InvalidRequestError
from core.request import RequestOutput
from router.frontdoor.backend import Backend, GenerateRequest

WorkerStateName = Literal["starting", "ready", "draining", "dead"]
WORKER_STATES: tuple[WorkerStateName, ...] = ("starting", "ready", "draining", "dead")
POOL_NAMES = ("prefill", "decode", "unified")
MAX_POOL_SIZE = 64


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    role: str
    """prefill, decode or unified."""
    state: WorkerStateName
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    """Fraction of KV blocks in use, 0..1."""
    prefix_hit_rate: float = 0.0
    """Cached prompt tokens / prompt tokens over the worker's life, 0..1."""


@dataclass(frozen=True)
class PoolInfo:
    name: str
    desired_size: int
    workers: tuple[WorkerInfo, ...] = ()


@dataclass(frozen=True)
class ClusterState:
    pools: tuple[PoolInfo, ...] = ()

    def pool(self, name: str) -> PoolInfo | None:
        return next((p for p in self.pools if p.name == name), None)


class ClusterAdmin(Protocol):
    """What an operator can ask of the cluster. Implementations raise
    `core.errors.InvalidRequestError` for an unknown pool / worker or a bad size."""

    async def state(self) -> ClusterState: ...

    async def scale(self, pool: str, size: int) -> None:
        """Set the desired size; returns once the change is under way (workers may still be
        starting or draining)."""
        ...

    async def drain(self, worker_id: str) -> None:
        """Stop sending new requests to the worker; it leaves once its requests finish."""
        ...


def check_scale_args(pool: str, size: int, known_pools: list[str]) -> None:
    """The shared validation of `scale` arguments (front doors and implementations)."""
    if pool not in known_pools:
        raise InvalidRequestError(f"unknown pool {pool!r}; pools: {', '.join(known_pools)}")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_POOL_SIZE:
        raise InvalidRequestError(f"pool size must be an integer in [0, {MAX_POOL_SIZE}]")


# -- in-process implementation (tests, LocalBackend) ----------------------------------------


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
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0
        self.num_active = 0

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        self.num_active += 1
        try:
            async for out in self.backend.generate(request):
                if out.finished:
                    self.num_prompt_tokens += len(out.prompt_token_ids)
                    self.num_cached_tokens += out.num_cached_tokens
                yield out
        finally:
            self.num_active -= 1

    async def abort(self, request_id: str) -> None:
        await self.backend.abort(request_id)

    def is_ready(self) -> bool:
        return self.state == "ready" and self.backend.is_ready()

    async def info(self) -> WorkerInfo:
        running = waiting = 0
        kv_usage = 0.0
        engine = getattr(self.backend, "engine", None)  # LocalBackend's AsyncEngine
        if engine is not None and self.state != "dead":
            load = await engine.call(lambda e: e.load(), timeout_s=5.0)
            running, waiting = load.num_running, load.num_waiting
            total = max(1, load.num_total_blocks)
            kv_usage = (load.num_total_blocks - load.num_free_blocks) / total
        hit = self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0
        return WorkerInfo(self.worker_id, self.role, self.state, running, waiting, kv_usage, hit)

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
            if name not in POOL_NAMES:
                raise ValueError(f"pool names are {POOL_NAMES}, got {name!r}")
        self._make_backend = make_backend
        self._pools = {name: _Pool(name, 0) for name in pools}
        self._ids = itertools.count()
        self._drain_poll_s = drain_poll_s
        self._drains: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
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
            infos = [await w.info() for w in p.workers]
            pools.append(PoolInfo(p.name, p.desired_size, tuple(infos)))
        return ClusterState(tuple(pools))

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

    def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        raise RuntimeError("worker is starting")

    async def abort(self, request_id: str) -> None:
        return None

    def is_ready(self) -> bool:
        return False
