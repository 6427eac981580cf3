"""The operator's view of the cluster: what the admin HTTP endpoints, the dashboard and the
gRPC `AdminService` call.

`ClusterAdmin` is the contract; `router.cluster.admin.ControllerAdmin` implements it over
the Ray pool controller (tests implement it over in-process engines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from core.errors import InvalidRequestError
from core.events import WorkerLoad
from core.roles import WorkerRole

WorkerStateName = Literal["starting", "ready", "draining", "dead"]
MAX_POOL_SIZE = 64


@dataclass(frozen=True)
class WorkerStatus:
    """One worker as an operator sees it: its state and its latest load report."""

    worker_id: str
    role: WorkerRole
    state: WorkerStateName
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    """Fraction of KV blocks in use, 0..1."""
    prefix_hit_rate: float = 0.0
    """Cached prompt tokens / prompt tokens over the worker's life, 0..1."""
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    num_prompt_tokens: int = 0
    """Prompt tokens the worker has taken in over its life."""
    num_cached_prompt_tokens: int = 0
    """Of those, the ones its prefix cache held (a hit rate over a window is the ratio
    of two differences of these)."""
    steps: dict[str, float] = field(default_factory=dict)
    """Its engine steps' totals (core.step_stats.StepTotals as a dict)."""
    adapters: tuple[str, ...] = ()
    """The LoRA adapters in its slots, least recently used first."""

    @classmethod
    def of(
        cls, worker_id: str, role: str, state: WorkerStateName, load: WorkerLoad | None
    ) -> WorkerStatus:
        """The status of a worker whose latest report is `load` (None: none yet)."""
        if load is None:
            return cls(worker_id, WorkerRole.parse(role), state)
        return cls(
            worker_id,
            WorkerRole.parse(role),
            state,
            load.num_running,
            load.num_waiting,
            load.kv_usage,
            load.prefix_hit_rate,
            load.num_free_blocks,
            load.num_total_blocks,
            load.num_prompt_tokens,
            load.num_cached_prompt_tokens,
            msgspec.structs.asdict(load.steps),
            load.adapters,
        )


@dataclass(frozen=True)
class PoolInfo:
    name: str
    desired_size: int
    workers: tuple[WorkerStatus, ...] = ()
    autoscale: dict[str, Any] | None = None
    """The autoscaler's latest decision for the pool (size, target, pressure, reason, the
    signals it read, at); None when autoscaling is off."""


@dataclass(frozen=True)
class ClusterState:
    pools: tuple[PoolInfo, ...] = ()
    autoscale_history: tuple[dict[str, Any], ...] = ()
    """The autoscaler's last decisions that changed a pool, oldest first (each as
    `PoolInfo.autoscale`); empty when autoscaling is off."""
    refused: tuple[str, ...] = ()
    """Why the preflight refused a worker, one line per pool it refused (core/preflight.py):
    that pool is not started again until the cluster is restarted with matching settings."""

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
