"""A decode worker's rank: everything it needs (reservations, receiving KV) is shared with
the prefill rank and lives in `worker.rank`; the class names the role."""

from __future__ import annotations

from worker.rank import WorkerRank


class DecodeRank(WorkerRank):
    pass
