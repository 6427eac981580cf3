"""`ClusterAdmin` (router.frontdoor.admin_api) over the Ray pool controller: what the
dashboard, the admin HTTP endpoints and the gRPC Admin service talk to on a real cluster."""

from __future__ import annotations

from typing import Any

from core.errors import InvalidRequestError
from router.cluster.deadlines import CONTROL_CALL_S, DRAIN_CALL_S, bounded
from router.cluster.membership import Membership
from router.frontdoor.admin_api import ClusterState, PoolInfo, WorkerStatus, check_scale_args


class ControllerAdmin:
    def __init__(self, controller: Any, membership: Membership) -> None:
        self.controller = controller
        self.membership = membership
        """Where the workers' latest reports are."""

    async def state(self) -> ClusterState:
        _, members = await bounded(
            self.controller.get_members.remote(), CONTROL_CALL_S, "the controller (members)"
        )
        desired = await self._desired()
        status = await bounded(
            self.controller.autoscale_status.remote(), CONTROL_CALL_S, "the controller (autoscale)"
        )
        refused = await bounded(
            self.controller.get_refused.remote(), CONTROL_CALL_S, "the controller (refused)"
        )
        decided = {d["pool"]: d for d in status["latest"]} if status else {}
        loads = self.membership.loads
        pools = []
        for pool, size in desired.items():
            workers = tuple(
                WorkerStatus.of(m.worker_id, m.role, m.state, loads.get(m.worker_id))
                for m in sorted(members, key=lambda m: m.worker_id)
                if m.role == pool
            )
            pools.append(PoolInfo(pool, size, workers, decided.get(pool)))
        history = tuple(status["history"]) if status else ()
        return ClusterState(tuple(pools), history, tuple(refused.values()))

    async def _desired(self) -> dict[str, int]:
        return await bounded(
            self.controller.get_desired.remote(), CONTROL_CALL_S, "the controller (pool sizes)"
        )

    async def scale(self, pool: str, size: int) -> None:
        desired = await self._desired()
        check_scale_args(pool, size, sorted(desired))
        try:
            await bounded(
                self.controller.scale.remote(pool, size), CONTROL_CALL_S, "the controller (scale)"
            )
        except ValueError as e:
            raise InvalidRequestError(str(e)) from e

    async def drain(self, worker_id: str) -> None:
        try:
            await bounded(
                self.controller.drain.remote(worker_id), DRAIN_CALL_S, "the controller (drain)"
            )
        except (KeyError, ValueError) as e:
            raise InvalidRequestError(str(e)) from e
