"""Stand-ins for what a front door's Membership talks to: an actor method's `.remote` and a
controller's member record (router/cluster/membership.py, tests/router/test_membership_*)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.records import WorkerInfo


@dataclass
class Call:
    """An actor method whose `.remote(...)` answers `value`."""

    value: Any

    def remote(self, *args: Any) -> Any:
        async def answer() -> Any:
            return self.value

        return answer()


@dataclass
class Member:
    worker_id: str
    role: str
    state: str
    info: WorkerInfo
    handle: Any = None
