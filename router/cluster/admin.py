"""`ClusterAdmin` (router/admin_api.py) over the Ray pool controller: what the dashboard,
the admin HTTP endpoints and the gRPC Admin service talk to on a real cluster."""

from __future__ import annotations

from typing import Any

from core.errors import InvalidRequestError
from router.frontdoor.admin_api import ClusterState, PoolInfo, WorkerInfo, check_scale_args


class ControllerAdmin:
    def __init__(self, controller: Any, backend: Any) -> None:
        self.controller = controller
        self.backend = backend
        """router.cluster.request_path.ClusterBackend: the latest worker reports."""

    async def state(self) -> ClusterState:
        _, members = await self.controller.get_members.remote()
        desired = await self.controller.get_desired.remote()
        pools = []
        for pool, size in desired.items():
            workers = []
            for m in sorted(members, key=lambda m: m.worker_id):
                if m.role != pool:
                    continue
                s = self.backend.stats.get(m.worker_id)
                workers.append(
                    WorkerInfo(
                        worker_id=m.worker_id,
                        role=m.role,
                        state=m.state,
                        num_running=s.num_running if s else 0,
                        num_waiting=s.num_waiting if s else 0,
                        kv_usage=s.kv_usage if s else 0.0,
                        prefix_hit_rate=s.prefix_hit_rate if s else 0.0,
                    )
                )
            pools.append(PoolInfo(pool, size, tuple(workers)))
        return ClusterState(tuple(pools))

    async def scale(self, pool: str, size: int) -> None:
        desired = await self.controller.get_desired.remote()
        check_scale_args(pool, size, sorted(desired))
        try:
            await self.controller.scale.remote(pool, size)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from e

    async def drain(self, worker_id: str) -> None:
        try:
            await self.controller.drain.remote(worker_id)
        except (KeyError, ValueError) as e:
            raise InvalidRequestError(str(e)) from e
