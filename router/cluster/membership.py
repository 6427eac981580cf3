"""The cluster as one front door sees it: the controller's ready workers, the model they
serve, and their latest reports.

A background task keeps it fresh: membership from the controller (a version number changes
with every join, leave or scale), then every worker's report: KV events into the router's
index, load into its policies, and the latest load kept for the admin view (and, through
it, the metrics). A decode worker stepping for this door sends its reports on the door's
output channel instead (`take_report`), and is left out of the polls while they come.
A worker whose actor died under a request is *suspected* at once (taken out of routing)
rather than at the controller's next health check.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from core.errors import WorkerFailedError
from core.events import WorkerLoad
from core.roles import WorkerRole
from router.cluster.deadlines import CONTROL_CALL_S, bounded
from router.routing.route import Router
from worker.records import WorkerInfo, WorkerReport

logger = logging.getLogger(__name__)

_SUSPECT_S = 30.0
"""How long a worker whose actor died stays out of routing unless the controller says
otherwise (it usually reports the death within a health-check interval)."""
_SYNC_EVERY_S = 0.25
_IDLE_POLL_MAX_S = 1.0
"""While no worker has work and no request has started here, the polls back off, doubling up
to this. Each poll is a Ray call per worker, and at 20 a second they kept ~5% of a core busy
in this process and ~7% in each worker: beside an idle server on two cores, the engine's
256-token prefill took 50.0 ms against 43.9 with one poll a second (41.0 with no server)."""
_REPORT_TIMEOUT_S = 5.0
_STREAMED_FRESH_S = 1.0
"""A worker whose report rode this door's output channel this recently is not polled: reports
ride it while the worker steps (with a request of this door), so a worker that stops stepping
here is polled again within this."""


class Membership:
    def __init__(
        self,
        controller: Any,
        router: Router,
        poll_interval_s: float = 0.05,
    ) -> None:
        self.controller = controller
        self.router = router
        self.poll_interval_s = poll_interval_s
        self.workers: dict[str, Any] = {}
        """worker id -> controller Member (state ready)."""
        self.loads: dict[str, WorkerLoad] = {}
        """worker id -> its latest report's load."""
        self.model: WorkerInfo | None = None
        """The first worker's facts: the model every worker serves (id, context, blocks)."""
        self.on_left: list[Callable[[str], None]] = []
        """Called with a worker id when it leaves for good (its output channel closes: a
        stream still open on it is retried elsewhere)."""
        self.on_draining: list[Callable[[str], None]] = []
        """Called with a worker id when it starts draining: no request is routed to it (the
        prefill gate fails its waiters, who are routed again), and the streams it runs go on
        to their end over its output channel."""
        self._draining: set[str] = set()
        self.door_report: Callable[[], Any] | None = None
        """This front door's queues and latencies for the controller's autoscaler
        (autoscale/signals.py door_report), sent every `door_report_every_s` when set (the
        autoscaler's interval: it reads no more often)."""
        self.door_report_every_s = 1.0
        self._version = -1
        self._prefill_pool_wanted = True
        """False when the prefill pool is scaled to 0 (decode workers then serve alone)."""
        self._task: asyncio.Task | None = None
        self._closing = False
        self._decode_block_size = 0
        self._resync: set[str] = set()
        self._cursors: dict[str, int] = {}
        """worker id -> the seq of the last KV-event batch applied from it."""
        self._streamed: dict[str, float] = {}
        """worker id -> when its last report came over this door's output channel."""
        self._suspects: dict[str, float] = {}
        """Workers whose actor died under a request, by when they were seen dead."""
        self._woken = asyncio.Event()
        """Set by `wake` (a request started here): back to `poll_interval_s` at once."""
        self.on_resync: list[Callable[[str], None]] = []
        """Called with a worker id when its index entry is re-read from its snapshot (the
        index missed its events, or the router found the entry untrue)."""
        router.store.set_resync_callback(lambda _model, worker_id: self._missed(worker_id))

    def _missed(self, worker_id: str) -> None:
        self._resync.add(worker_id)
        for call in self.on_resync:
            call(worker_id)

    async def start(self) -> None:
        await self.sync()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def close(self) -> None:
        if self._task is not None:
            # The flag too: on Python 3.11 an `asyncio.wait_for` whose inner wait completes as
            # the cancellation arrives returns instead of raising, and the loop would go on.
            self._closing = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wake(self) -> None:
        """A request started: poll every `poll_interval_s` again (from the next poll on)."""
        self._woken.set()

    def _next_interval(self, interval: float) -> float:
        """The nap after a poll: `poll_interval_s` while a request started since the last one
        or some worker had work at its report, else twice the last, up to _IDLE_POLL_MAX_S."""
        busy = any(load.num_running or load.num_waiting_tokens for load in self.loads.values())
        if self._woken.is_set() or busy:
            return self.poll_interval_s
        return min(2 * interval, _IDLE_POLL_MAX_S)

    def is_ready(self) -> bool:
        """A request can be served now: both pools have a live worker (or decode workers
        serve alone, by choice or in unified mode)."""
        roles = {m.role for m in self.workers.values()}
        return (
            WorkerRole.UNIFIED in roles
            or {WorkerRole.PREFILL, WorkerRole.DECODE} <= roles
            or (WorkerRole.DECODE in roles and not self._prefill_pool_wanted)
        )

    def suspect(self, worker_id: str) -> None:
        """An actor call failed because the actor is gone: stop routing to it now."""
        self._suspects[worker_id] = time.monotonic()
        if self.workers.pop(worker_id, None) is not None:
            self.loads.pop(worker_id, None)
            self.router.remove_worker(worker_id)
            logger.warning("router: worker %s is gone; no longer routing to it", worker_id)

    async def sync(self) -> None:
        """Bring the workers in step with the controller's membership."""
        version, members = await self._ask_controller("get_members", "members")
        now = time.monotonic()
        cleared = any(now - t >= _SUSPECT_S for t in self._suspects.values())
        if version == self._version and not cleared:
            return
        self._version = version
        # Pool sizes only matter when membership changed (scaling bumps the version too).
        desired = await self._ask_controller("get_desired", "pool sizes")
        self._prefill_pool_wanted = desired.get(WorkerRole.PREFILL, 0) > 0
        ready = {m.worker_id: m for m in members if m.state == "ready"}
        draining = {m.worker_id for m in members if m.state == "draining"}
        for worker_id in [w for w in self.workers if w not in ready]:
            self._leave(worker_id, draining=worker_id in draining)
        for worker_id in self._draining - draining:  # drained (or died draining): gone
            self._draining.discard(worker_id)
            self._left(worker_id)
        # A suspect the controller still lists as ready after _SUSPECT_S was alive after all
        # (its call failed for another reason): it rejoins, membership change or not.
        self._suspects = {w: t for w, t in self._suspects.items() if now - t < _SUSPECT_S}
        for worker_id, m in ready.items():
            if worker_id not in self.workers and worker_id not in self._suspects:
                self._join(m)

    async def _ask_controller(self, method: str, what: str, *args: Any) -> Any:
        """A controller call, bounded; a controller that is gone is a clean error (a request
        waiting on it fails with 503 rather than Ray's exception). Its workers died with it
        (Ray ends actors with their owner); Ray restarts it, and the next poll that reaches
        it brings the pools back (controller.py)."""
        try:
            return await bounded(
                getattr(self.controller, method).remote(*args),
                CONTROL_CALL_S,
                f"the controller ({what})",
            )
        except Exception as e:
            # Imported here, not at the top: Ray must not be imported before init_ray has
            # set its environment (a local cluster would listen beyond loopback).
            from ray.exceptions import RayActorError

            if not isinstance(e, RayActorError):
                raise
            raise WorkerFailedError(
                f"the cluster's controller is unavailable ({type(e).__name__}: Ray is "
                "restarting it, or it is gone): no worker can be found or replaced now"
            ) from e

    def _join(self, member: Any) -> None:
        info: WorkerInfo = member.info
        # Prompts are hashed by the block size of the pool they run on first (prefill, or
        # unified); a decode pool of another block size (worker/landing.py) by its own too.
        hashed_by_decode = self.model is not None and self.model.role == WorkerRole.DECODE
        if self.model is None or (hashed_by_decode and info.role != WorkerRole.DECODE):
            self.model = info
            self.router.register_model(info.model_id, info.block_size)
            self.router.set_kv_bytes_per_token(info.kv_bytes_per_block / info.block_size)
        if info.role == WorkerRole.DECODE:  # its prefixes are found by its own block size
            self._decode_block_size = info.block_size
        if self._decode_block_size:  # again after the model is registered anew
            self.router.models.set_decode_block_size(self.model.model_id, self._decode_block_size)
        self.workers[member.worker_id] = member
        self.router.add_worker(member.worker_id, member.role, self.model.model_id, info.block_size)
        logger.info("router: worker %s (%s) joined", member.worker_id, member.role)

    def _leave(self, worker_id: str, draining: bool = False) -> None:
        """Out of routing; `draining`: its streams run on until it is gone (`_left`)."""
        del self.workers[worker_id]
        self.loads.pop(worker_id, None)
        self._cursors.pop(worker_id, None)
        self._streamed.pop(worker_id, None)
        self.router.remove_worker(worker_id)
        if not draining:
            self._left(worker_id)
            return
        self._draining.add(worker_id)
        for callback in self.on_draining:
            callback(worker_id)
        logger.info("router: worker %s draining; no longer routing to it", worker_id)

    def _left(self, worker_id: str) -> None:
        for callback in self.on_left:
            callback(worker_id)
        logger.info("router: worker %s left", worker_id)

    async def _poll_forever(self) -> None:
        last_sync = last_report = 0.0
        interval = self.poll_interval_s
        while not self._closing:
            try:
                if time.monotonic() - last_sync > _SYNC_EVERY_S:
                    await self.sync()
                    last_sync = time.monotonic()
                if self.door_report and time.monotonic() - last_report > self.door_report_every_s:
                    await self._ask_controller("report_door", "door report", self.door_report())
                    last_report = time.monotonic()
                await self.poll_reports()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("router: polling workers failed")
            interval = self._next_interval(interval)
            self._woken.clear()
            with contextlib.suppress(TimeoutError):  # a request starting ends an idle nap
                await asyncio.wait_for(self._woken.wait(), interval)
            if self._woken.is_set() and interval > self.poll_interval_s:
                await asyncio.sleep(self.poll_interval_s)  # not in the request's first steps

    async def poll_reports(self) -> None:
        for worker_id in list(self._resync):  # the index missed events of these: snapshot
            self._resync.discard(worker_id)
            m = self.workers.get(worker_id)
            if m is not None:
                with contextlib.suppress(Exception):
                    snapshot = await asyncio.wait_for(m.handle.snapshot.remote(), _REPORT_TIMEOUT_S)
                    self.router.apply(snapshot)
                    self._cursors[worker_id] = snapshot.seq
        now = time.monotonic()
        members = [  # a worker whose reports ride this door's output channel needs no call
            m
            for m in self.workers.values()
            if now - self._streamed.get(m.worker_id, -math.inf) > _STREAMED_FRESH_S
        ]
        results = await asyncio.gather(
            *(
                asyncio.wait_for(
                    m.handle.report.remote(self._cursors.get(m.worker_id, -1)),
                    _REPORT_TIMEOUT_S,
                )
                for m in members
            ),
            return_exceptions=True,
        )
        for m, report in zip(members, results, strict=True):
            if not isinstance(report, BaseException):
                self._take(m.worker_id, report)

    def cursor(self, worker_id: str) -> int:
        """The seq of the last KV-event batch applied from `worker_id` (-1: none)."""
        return self._cursors.get(worker_id, -1)

    def take_report(self, worker_id: str, report: WorkerReport) -> None:
        """A report that rode `worker_id`'s output channel (router/cluster/worker_channel.py):
        while they come, the polls leave that worker out."""
        if worker_id in self.workers:
            self._streamed[worker_id] = time.monotonic()
            self._take(worker_id, report)

    def _take(self, worker_id: str, report: WorkerReport) -> None:
        """Apply a report, polled or streamed: the two paths can cross, so only KV-event
        batches after the last applied one (or a worker's first, seq 0, which clears its
        blocks: a restart, or the log replayed from its start), and no load older than the
        last."""
        cursor = self._cursors.get(worker_id, -1)
        for batch in report.events:
            if batch.seq > cursor or batch.seq == 0:
                self.router.apply(batch)
                cursor = self._cursors[worker_id] = batch.seq
        load: WorkerLoad = report.load
        last = self.loads.get(worker_id)
        if last is not None and load.timestamp < last.timestamp:
            return
        self.router.report_load(load)
        if worker_id in self.workers:
            self.loads[worker_id] = load
