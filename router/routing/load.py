"""Worker load as the router sees it: the last report plus its own in-flight accounting.

A `WorkerLoad` report is a snapshot the worker took at some moment; requests the router sent
since then are not in it. So each worker keeps an *epoch* (reports received) and counters of
work routed in the current epoch:

    queued_prefill_tokens = report.num_waiting_tokens + prefill tokens routed since the report
    running               = report.num_running        + requests routed since the report
    free_blocks           = report.num_free_blocks    - blocks reserved since the report

A new report resets the counters (the worker now counts that work itself). When the cluster
says a request's prefill (or the whole request) is done, its contribution is subtracted only
if it was routed in the current epoch; otherwise the report already accounted for it.
Without any report, counters alone give the load (free blocks unknown: `has_capacity_info`).

Pools (router.routing.pool) are built on first use per (model, role) and dropped when the membership
changes; every change of a worker's queued prefill tokens re-files it in the pools it belongs
to, so the policies read the pool's min / max load without scanning it. Hence: WorkerStates
are mutated only here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.events import WorkerLoad
from router.routing.pool import Pool

ROLES = ("prefill", "decode", "unified")


@dataclass(slots=True)
class WorkerState:
    """Mutable per-worker load; owned by LoadTracker, read by the policies."""

    worker_id: str
    role: str
    model: str
    reported_waiting_tokens: int = 0
    reported_running: int = 0
    reported_free_blocks: int = 0
    total_blocks: int = 0
    epoch: int = 0
    pending_prefill_tokens: int = 0
    pending_requests: int = 0
    pending_blocks: int = 0
    num_routed: int = 0

    @property
    def queued_prefill_tokens(self) -> int:
        return self.reported_waiting_tokens + self.pending_prefill_tokens

    @property
    def running(self) -> int:
        return self.reported_running + self.pending_requests

    @property
    def has_capacity_info(self) -> bool:
        return self.total_blocks > 0

    @property
    def free_blocks(self) -> int:
        return max(0, self.reported_free_blocks - self.pending_blocks)


@dataclass(slots=True)
class _Ticket:
    """What one routed request added, so it can be taken back exactly once."""

    prefill: WorkerState | None
    prefill_epoch: int
    prefill_tokens: int
    decode: WorkerState
    decode_epoch: int
    decode_blocks: int
    prefill_done: bool = False


@dataclass
class LoadTracker:
    """Per-worker load states and the in-flight requests; not thread-safe (the Router locks)."""

    workers: dict[str, WorkerState] = field(default_factory=dict)
    _tickets: dict[str, _Ticket] = field(default_factory=dict)
    _pools: dict[tuple[str, str], Pool] = field(default_factory=dict)
    # worker id -> (pool, position) for every built pool holding the worker
    _filed_in: dict[str, list[tuple[Pool, int]]] = field(default_factory=dict)

    def add_worker(self, worker_id: str, role: str, model: str) -> WorkerState:
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; choose from {ROLES}")
        state = self.workers.get(worker_id)
        if state is None or state.role != role or state.model != model:
            state = self.workers[worker_id] = WorkerState(worker_id, role, model)
            self._drop_pools()
        return state

    def remove_worker(self, worker_id: str) -> WorkerState | None:
        self._drop_pools()
        return self.workers.pop(worker_id, None)

    def _drop_pools(self) -> None:
        self._pools.clear()
        self._filed_in.clear()

    def _refile(self, worker: WorkerState) -> None:
        """The worker's queued prefill tokens changed: keep its pools' load order true."""
        for pool, i in self._filed_in.get(worker.worker_id, ()):
            pool.refile(i)

    def report(self, load: WorkerLoad) -> bool:
        """Take a report; False if the worker is unknown (reports never add workers)."""
        state = self.workers.get(load.worker_id)
        if state is None:
            return False
        state.reported_waiting_tokens = load.num_waiting_tokens
        state.reported_running = load.num_running
        state.reported_free_blocks = load.num_free_blocks
        state.total_blocks = load.num_total_blocks
        state.epoch += 1
        state.pending_prefill_tokens = state.pending_requests = state.pending_blocks = 0
        self._refile(state)
        return True

    def start(
        self,
        request_id: str,
        prefill: WorkerState | None,
        prefill_tokens: int,
        decode: WorkerState,
        decode_blocks: int,
    ) -> None:
        """Account a routed request. Prefill on the decode worker counts as its prefill work."""
        if request_id in self._tickets:
            raise ValueError(f"request {request_id!r} is already in flight")
        prefill_worker = prefill if prefill is not None else decode
        prefill_worker.pending_prefill_tokens += prefill_tokens
        prefill_worker.num_routed += 1
        if prefill_tokens:
            self._refile(prefill_worker)
        decode.pending_requests += 1
        decode.pending_blocks += decode_blocks
        if prefill is not None:
            decode.num_routed += 1
        self._tickets[request_id] = _Ticket(
            prefill_worker,
            prefill_worker.epoch,
            prefill_tokens,
            decode,
            decode.epoch,
            decode_blocks,
        )

    def prefill_done(self, request_id: str) -> bool:
        ticket = self._tickets.get(request_id)
        if ticket is None or ticket.prefill_done:
            return False
        ticket.prefill_done = True
        p = ticket.prefill
        if p is not None and p.epoch == ticket.prefill_epoch:
            p.pending_prefill_tokens = max(0, p.pending_prefill_tokens - ticket.prefill_tokens)
            self._refile(p)
        return True

    def request_done(self, request_id: str) -> bool:
        """The request finished or failed: release whatever it still holds."""
        self.prefill_done(request_id)
        ticket = self._tickets.pop(request_id, None)
        if ticket is None:
            return False
        d = ticket.decode
        if d.epoch == ticket.decode_epoch:
            d.pending_requests = max(0, d.pending_requests - 1)
            d.pending_blocks = max(0, d.pending_blocks - ticket.decode_blocks)
        return True

    @property
    def num_in_flight(self) -> int:
        return len(self._tickets)

    def pool(self, model: str, role: str) -> Pool:
        """Workers that can serve `role` for `model` (unified workers serve both pools).
        Cached until the membership changes; callers must not mutate it."""
        key = (model, role)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = Pool(
                [
                    w
                    for w in self.workers.values()
                    if w.model == model and (w.role == role or w.role == "unified")
                ]
            )
            for i, w in enumerate(pool.workers):
                self._filed_in.setdefault(w.worker_id, []).append((pool, i))
        return pool
