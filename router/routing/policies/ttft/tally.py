"""The bounded load's bookkeeping: two decayed tallies per prefill worker.

    P_w  seconds of prefill the policy placed on w: each Choice's placed_s (work_w, or
         work'_w with a pull), here or in another router replica
    M_w  engine seconds w's reports add between decisions (StepRate.busy_s); a restarted
         worker's total starts again, and nothing negative is counted

Every decision of the pool's decays both a step (half-life `halflife` decisions) and adds
the work placed to the chosen worker's P_w. Router replicas count each other's decisions:
each decision's work_w reaches the other replicas with its load share
(router.routing.load_share) and goes into their P_w (`TtftPrefill.placed_elsewhere`), a
decay step included, so every replica bounds the pool's placements, not only its own. Each
counting only its own, N replicas would each hold about 1/N of the pool's tallies, and a
request would weigh N times as much against them. Workers that left the pool are forgotten
once the tables hold twice the pool.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.worker_state import WorkerState


class Tally:
    """P_w and M_w. Owned by one policy; mutated by `measure` and `place` only."""

    def __init__(self, halflife: float) -> None:
        self._decay = 0.5 ** (1.0 / halflife)
        self.placed: dict[str, float] = {}
        """P_w."""
        self.measured: dict[str, float] = {}
        """M_w."""
        self._seen_busy: dict[str, float] = {}
        """Each worker's lifetime engine seconds at the last decision (StepRate.busy_s)."""

    def placed_on(self, workers: Sequence[WorkerState]) -> list[float]:
        """P_w of each worker, in pool order."""
        placed = self.placed
        return [placed.get(w.worker_id, 0.0) for w in workers]

    def measure(self, workers: Sequence[WorkerState], s_per_token: float) -> list[float] | None:
        """M_w + t_w * L_w of each worker (t_w: its calibrated speed, else `s_per_token`),
        after adding its engine seconds since the last decision to M_w. None until some
        worker has reported work: queues alone would put any worker with one over the mean
        of a pool just started."""
        measured, seen = self.measured, self._seen_busy
        loads: list[float] = []
        for w in workers:
            wid, rate = w.worker_id, w.step_rate
            last = seen.get(wid)
            if last is not None and rate.busy_s > last:
                measured[wid] = measured.get(wid, 0.0) + rate.busy_s - last
            seen[wid] = rate.busy_s
            t = rate.s_per_token or s_per_token
            loads.append(measured.get(wid, 0.0) + t * w.queued_prefill_tokens)
        if not any(measured.get(w.worker_id) for w in workers):
            return None
        return loads

    def place(self, workers: Sequence[WorkerState], worker_id: str, placed_s: float) -> None:
        """One decision of the pool's, here or in another replica: every tally decays a
        step, the chosen worker's takes the work placed on it."""
        decay, placed, measured = self._decay, self.placed, self.measured
        for w in workers:
            wid = w.worker_id
            placed[wid] = placed.get(wid, 0.0) * decay
            if wid in measured:
                measured[wid] *= decay
        placed[worker_id] += placed_s
        if len(placed) > 2 * len(workers):  # workers that left the pool
            live = {w.worker_id for w in workers}
            for table in (placed, measured, self._seen_busy):
                for wid in [k for k in table if k not in live]:
                    del table[wid]
