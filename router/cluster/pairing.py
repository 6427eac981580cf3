"""How the controller connects two workers' KV transports, both ways.

A decode worker answers a prefill worker's metadata with where each prefill rank sends
(`accept`: the matching rank of its own cache, or, for a prefill worker laid out otherwise,
the landing areas of the ranks that need its heads: worker/landing.py), and the prefill
worker connects by that answer (`route`). Two prefill workers (one pool: laid out alike, as
the preflight makes sure) connect rank to rank (`connect`), for prefix migration.
"""

from __future__ import annotations

from typing import Any

from core.roles import WorkerRole
from router.cluster.deadlines import CONTROL_CALL_S, bounded


async def pair_workers(a: Any, b: Any) -> None:
    """Connect members `a` and `b` (controller Members with their WorkerInfo)."""
    if WorkerRole.DECODE in (a.role, b.role):
        decode, prefill = (a, b) if a.role == WorkerRole.DECODE else (b, a)
        routes = await bounded(
            decode.handle.accept.remote(prefill.info.transport_metadata),
            CONTROL_CALL_S, f"{decode.worker_id} (accept {prefill.worker_id})",
        )  # fmt: skip
        await bounded(
            prefill.handle.route.remote(routes),
            CONTROL_CALL_S, f"{prefill.worker_id} (route to {decode.worker_id})",
        )  # fmt: skip
        return
    for x, y in ((b, a), (a, b)):
        await bounded(
            x.handle.connect.remote(y.info.transport_metadata),
            CONTROL_CALL_S, f"{x.worker_id} (connect to {y.worker_id})",
        )  # fmt: skip
