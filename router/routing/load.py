"""The router's one in-flight ledger: worker load as the last report plus what was routed
since, and what each routed request added to it.

A `WorkerLoad` report is a snapshot the worker took at some moment; requests routed since
then are not in it. So each worker keeps an *epoch* (reports received) and counters of work
routed in the current epoch:

    L_w (queued prefill tokens) = report.num_waiting_tokens + admitted since the report
                                  + routed here, still waiting at the prefill gate
                                  + the same two of the other router replicas
    running                     = report.num_running        + requests routed since
    free_blocks                 = report.num_free_blocks    - blocks reserved since

A new report resets the since-the-report counters (the worker now counts that work
itself); tokens still at the gate are never in a report and stay. A report can reach the
router after the reply of a prefill it still counts as backlog (the router polls every
worker together, so a busy one delays the others' reports): each prefill's reply says
between which engine steps the worker counted it, and the router takes those tokens out of
any report taken in that window. (The reverse, a report taken before a request admitted
here reached the worker, still drops its tokens until the next report.) Each routed request gets
one `Charge`, which moves through its stages exactly once each

    GATED --admit--> ADMITTED --prefill_done--> PREFILLED --close--> CLOSED
      `-------------------prefill_done / close ----------------------^

and takes back only what is still charged (a since-the-report part only in its own epoch).
A request prefilled by its decode worker is admitted at once (no gate). With `share` set,
each stage also goes to the other router replicas, and theirs come in through `remote`
(router.routing.load_share).

Pools (router.routing.pool) are built on first use per (model, role) and dropped when the
membership changes; every change of a worker's L_w re-files it in the pools it belongs to,
so the policies read a pool's min / max load without scanning it. Hence WorkerStates are
mutated only here. Not thread-safe: the Router holds its lock around every call.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from core.events import WorkerLoad
from core.roles import WorkerRole
from router.routing.index.pending import DEFAULT_TTL_S
from router.routing.load_share import LoadShare, Stage
from router.routing.pool import Pool
from router.routing.worker_state import WorkerState

__all__ = ["Charge", "LoadTracker", "Stage"]

_charge_ids = itertools.count()


@dataclass(slots=True, eq=False)
class Charge:
    """What one routed request added to the ledger."""

    prefill: WorkerState
    """The worker that prefills: the prefill worker, or the decode worker itself."""
    prefill_tokens: int
    decode: WorkerState
    decode_epoch: int
    decode_blocks: int
    stage: Stage = Stage.GATED
    prefill_epoch: int = -1
    """The prefill worker's epoch when the request was admitted."""
    placed_s: float = 0.0
    """What the prefill policy counted against `prefill` (told to other replicas)."""
    number: int = field(default_factory=_charge_ids.__next__)
    """Names the charge in the shares other replicas receive (router.routing.load_share)."""


@dataclass
class LoadTracker:
    """Per-worker load states and the open charges."""

    workers: dict[str, WorkerState] = field(default_factory=dict)
    num_in_flight: int = 0
    """Charges not closed yet."""
    share: Callable[[LoadShare], None] | None = None
    """Tells the other router replicas of each prefill stage (None: no replicas)."""
    clock: Callable[[], float] = time.time
    """Wall-clock seconds, as the workers stamp their reports (a simulator's own clock)."""
    remote_ttl_s: float = DEFAULT_TTL_S
    """Another replica's gated charge is dropped when this much older than a report."""
    hash_block_size: dict[str, int] = field(default_factory=dict)
    """Model -> the block size the router hashes its prompts by, which counts blocks here."""
    _pools: dict[tuple[str, WorkerRole], Pool] = field(default_factory=dict)
    # worker id -> (pool, position) for every built pool holding the worker
    _filed_in: dict[str, list[tuple[Pool, int]]] = field(default_factory=dict)

    def add_worker(self, worker_id: str, role: str, model: str) -> WorkerState:
        wrole = WorkerRole.parse(role)
        state = self.workers.get(worker_id)
        if state is None or state.role != wrole or state.model != model:
            state = self.workers[worker_id] = WorkerState(worker_id, wrole, model)
            self._drop_pools()
        return state

    def remove_worker(self, worker_id: str) -> WorkerState | None:
        self._drop_pools()
        return self.workers.pop(worker_id, None)

    def _drop_pools(self) -> None:
        self._pools.clear()
        self._filed_in.clear()

    def _refile(self, worker: WorkerState) -> None:
        """The worker's L_w changed: keep its pools' load order true."""
        for pool, i in self._filed_in.get(worker.worker_id, ()):
            pool.refile(i)

    def report(self, load: WorkerLoad) -> bool:
        """Take a report; False if the worker is unknown (reports never add workers)."""
        state = self.workers.get(load.worker_id)
        if state is None:
            return False
        step = load.steps.steps
        if step < state.reported_step:  # restarted: its old prefills are in no report
            state.prefilled.clear()
        state.prefilled = [p for p in state.prefilled if p[1] > step]
        counted = sum(tokens for arrived, _, tokens in state.prefilled if arrived <= step)
        state.reported_waiting_tokens = max(0, load.num_waiting_tokens - counted)
        state.reported_step = step
        state.reported_running = load.num_running
        state.reported_free_blocks, state.total_blocks = self._in_hash_blocks(state, load)
        state.epoch += 1
        state.reported_at = load.timestamp
        state.remote.reported(load.timestamp, self.remote_ttl_s)
        state.step_rate.update(load)
        state.pending_prefill_tokens = state.pending_requests = state.pending_blocks = 0
        state.adapters = set(load.adapters)
        state.max_loras = load.max_loras
        self._refile(state)
        return True

    def _in_hash_blocks(self, state: WorkerState, load: WorkerLoad) -> tuple[int, int]:
        """The worker's free and total blocks, counted in the model's hashing blocks."""
        own, counted = state.block_size, self.hash_block_size.get(state.model, 0)
        if not own or not counted or own == counted:
            return load.num_free_blocks, load.num_total_blocks
        return load.num_free_blocks * own // counted, load.num_total_blocks * own // counted

    # -- one request's charge --------------------------------------------------------------
    def start(
        self,
        prefill: WorkerState | None,
        prefill_tokens: int,
        decode: WorkerState,
        decode_blocks: int,
        placed_s: float = 0.0,
        adapter: str | None = None,
    ) -> Charge:
        """Charge a routed request: its prefill tokens wait at the gate of `prefill`, or,
        with no prefill worker, are admitted to the decode worker at once. `placed_s`: the
        prefill policy's own count of the work (router.routing.load_share). `adapter`: its
        LoRA adapter, held by both workers from now on (router.routing.adapters)."""
        if adapter is not None:
            decode.adapters.add(adapter)
            if prefill is not None:
                prefill.adapters.add(adapter)
        charge = Charge(
            prefill or decode,
            prefill_tokens,
            decode,
            decode.epoch,
            decode_blocks,
            placed_s=placed_s,
        )
        charge.prefill.gated_prefill_tokens += prefill_tokens
        if prefill is not None:
            self._refile(prefill)
            self._tell(charge)
        else:  # the decode worker prefills: no gate, admitted at once
            self.admit(charge)
        decode.pending_requests += 1
        decode.pending_blocks += decode_blocks
        self.num_in_flight += 1
        return charge

    def admit(self, charge: Charge) -> None:
        """The prefill gate let the request in: its tokens are the worker's now."""
        if charge.stage is not Stage.GATED:
            return
        p, tokens = charge.prefill, charge.prefill_tokens
        charge.stage, charge.prefill_epoch = Stage.ADMITTED, p.epoch
        p.gated_prefill_tokens -= tokens
        p.admitted_prefill_tokens += tokens
        p.pending_prefill_tokens += tokens
        self._refile(p)
        self._tell(charge)

    def prefill_done(self, charge: Charge, backlog: tuple[int, int, int] | None = None) -> bool:
        """The prefill finished (or will not happen). True if admitted tokens were freed.
        `backlog`: (arrived, ended, tokens), the engine steps between which the worker's
        reports counted `tokens` of it (prefill_worker.connector.PrefillResult.backlog)."""
        stage = charge.stage
        if stage >= Stage.PREFILLED:
            return False
        p, tokens = charge.prefill, charge.prefill_tokens
        charge.stage = Stage.PREFILLED
        if stage is Stage.GATED:
            p.gated_prefill_tokens -= tokens
        else:
            p.admitted_prefill_tokens -= tokens
            if p.epoch == charge.prefill_epoch:
                p.pending_prefill_tokens = max(0, p.pending_prefill_tokens - tokens)
        self._backlog(p, backlog)
        self._refile(p)
        self._tell(charge, backlog)
        return stage is Stage.ADMITTED

    @staticmethod
    def _backlog(p: WorkerState, backlog: tuple[int, int, int] | None) -> None:
        if backlog is not None and backlog[1] > p.reported_step:
            arrived, _, counted = backlog
            if arrived <= p.reported_step:  # the last report counts it: no longer true
                p.reported_waiting_tokens = max(0, p.reported_waiting_tokens - counted)
            p.prefilled.append(backlog)  # and a report still on its way may count it

    def close(self, charge: Charge) -> bool:
        """The request finished, failed or was cancelled: take back whatever it still holds.
        True if admitted tokens were freed."""
        if charge.stage is Stage.CLOSED:
            return False
        freed = self.prefill_done(charge)
        charge.stage = Stage.CLOSED
        d = charge.decode
        if d.epoch == charge.decode_epoch:
            d.pending_requests = max(0, d.pending_requests - 1)
            d.pending_blocks = max(0, d.pending_blocks - charge.decode_blocks)
        self.num_in_flight -= 1
        return freed

    # -- other replicas' charges (router.routing.load_share) -------------------------------
    def _tell(self, charge: Charge, backlog: tuple[int, int, int] | None = None) -> None:
        if self.share is not None and (charge.prefill_tokens or backlog is not None):
            p = charge.prefill
            self.share(
                LoadShare(
                    charge.number, p.worker_id, charge.prefill_tokens, charge.stage,
                    self.clock(), backlog,
                    charge.placed_s if charge.stage is Stage.GATED else 0.0,
                )
            )  # fmt: skip

    def remote(self, replica: bytes, share: LoadShare) -> None:
        """Another replica's charge moved to `share.stage`."""
        w = self.workers.get(share.worker)
        if w is None:
            return
        w.remote.apply(replica, share, w.reported_at)
        if share.stage is Stage.PREFILLED:
            self._backlog(w, share.backlog)
        self._refile(w)

    def forget_remote(self) -> None:
        """Drop every other replica's charge (their stages stopped reaching us)."""
        for w in self.workers.values():
            if len(w.remote):
                w.remote.clear()
                self._refile(w)

    # -- pools -----------------------------------------------------------------------------
    def pool(self, model: str, role: WorkerRole) -> Pool:
        """Workers that can serve `role` for `model`: the prefill pool holds prefill
        workers; the decode pool decode and unified ones (a unified worker prefills its own
        requests, so it is never chosen as another request's prefill worker). Cached until
        the membership changes; callers must not mutate it."""
        key = (model, role)
        pool = self._pools.get(key)
        if pool is None:
            roles = (role,) if role is WorkerRole.PREFILL else (role, WorkerRole.UNIFIED)
            pool = self._pools[key] = Pool(
                [w for w in self.workers.values() if w.model == model and w.role in roles]
            )
            for i, w in enumerate(pool.workers):
                self._filed_in.setdefault(w.worker_id, []).append((pool, i))
        return pool
