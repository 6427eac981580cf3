"""The autoscaler's loop inside the controller: every `interval_s`, read the pools' signals,
decide (policy.py), and resize through the controller, which starts workers or drains them
(a scale-down never kills a request: the drained worker finishes what it runs).

Workers ask Ray for their resources when they start; on a cluster with an autoscaler (Ray's,
KubeRay's) that is what brings a node, so nothing here assumes a node exists: a worker
that cannot be placed stays `starting` (counted in its pool, so it is not asked for again)
until the controller's start timeout gives up on it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from core.events import WorkerLoad
from router.cluster.autoscale.policy import AutoscaleConfig, Autoscaler, Decision
from router.cluster.autoscale.signals import DoorReport, SignalCollector
from router.cluster.deadlines import CONTROL_CALL_S, bounded

logger = logging.getLogger(__name__)

_HISTORY = 50


class AutoscaleLoop:
    def __init__(
        self,
        config: AutoscaleConfig,
        members: Callable[[], list[Any]],
        sizes: Callable[[], dict[str, int]],
        resize: Callable[[str, int], Awaitable[Any]],
    ) -> None:
        """`members`: the controller's members now; `sizes`: the desired pool sizes;
        `resize(pool, size)`: the controller's scale."""
        self.config = config
        self.policy = Autoscaler(config)
        self.signals = SignalCollector(stale_after_s=5 * config.interval_s)
        self._members, self._sizes, self._resize = members, sizes, resize
        self.latest: list[Decision] = []
        self.history: collections.deque[Decision] = collections.deque(maxlen=_HISTORY)
        """The last decisions that changed a pool, newest last."""

    def add_door(self, report: DoorReport) -> None:
        self.signals.add_door(report)

    async def run_forever(self) -> None:
        while True:
            try:
                await self.evaluate_once()
            except Exception:
                logger.exception("autoscale: evaluation failed")
            await asyncio.sleep(self.config.interval_s)

    async def evaluate_once(self) -> list[Decision]:
        members = self._members()
        ready = [m for m in members if m.state == "ready"]
        answers = await asyncio.gather(
            *(bounded(m.handle.load.remote(), CONTROL_CALL_S, f"{m.worker_id} (load)")
              for m in ready),
            return_exceptions=True,
        )  # fmt: skip
        loads = [(m.role, a) for m, a in zip(ready, answers) if isinstance(a, WorkerLoad)]
        starting = collections.Counter(m.role for m in members if m.state == "starting")
        sizes = self._sizes()
        signals = self.signals.pools(sizes, dict(starting), loads)
        decisions = self.policy.decide(signals, sizes, time.time())
        for d in decisions:
            if d.target == d.size:
                logger.debug(d.line())
                continue
            logger.info(d.line())
            self.history.append(d)
            await self._resize(d.pool, d.target)
        self.latest = decisions
        return decisions

    def status(self) -> dict[str, Any]:
        """For the admin API and the dashboard: the settings, each pool's latest decision
        (with its inputs) and the last changes."""
        return {
            "config": asdict(self.config),
            "latest": [asdict(d) for d in self.latest],
            "history": [asdict(d) for d in self.history],
        }
