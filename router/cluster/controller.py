"""The pool controller: a named Ray actor that owns the desired size of each pool.

It starts worker actors (each asks for its resources plus a custom `prefill` / `decode` /
`unified` resource so pools can be pinned to node types), connects every prefill worker's
transport with every decode worker's, health-checks all of them, restarts dead ones,
and drains workers on scale-down (stop admitting, finish what runs, then exit). With Redis
the desired sizes live there, so a restarted controller keeps them.

Ray restarts the controller when it dies (`max_restarts=-1`, bringup.py). Its workers die
with it (Ray ends actors with their owner), so a restarted controller starts the pools
afresh as soon as a front door asks it anything, under worker ids no earlier incarnation
used (its `incarnation` is in them and in the membership version), so no front door takes
a new worker for a dead one. Requests in flight when it died fail with a clear error;
later ones are served once the new pools are up.

Front doors poll `members()` (a version number changes with every membership change) and
route only to workers in state `ready`. This is the only router module that imports the
worker packages, to start their actors.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

import ray

from core.errors import error_message
from core.preflight import PreflightError, UnpairableError, check_joining
from core.roles import WorkerRole
from router.cluster.pairing import pair_workers
from router.cluster.pool_sizes import SavedPoolSizes
from router.cluster.spec import ClusterSpec

logger = logging.getLogger(__name__)

CONTROLLER_NAME = "baton-controller"


@dataclass(frozen=True)
class Member:
    worker_id: str
    role: str
    state: str
    """starting | ready | draining | dead"""
    handle: Any
    info: Any = None
    """worker.records.WorkerInfo once ready."""
    started_at: float = 0.0
    placement: Any = None
    """The placement group of a worker with tp > 1 (removed with the worker)."""


class Controller:
    def __init__(self, spec: ClusterSpec) -> None:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        self.spec = spec
        self.desired = spec.initial_pools()
        self.members: dict[str, Member] = {}
        self.version = 0
        self.last_start_failure = ""
        """Why the last worker that failed to start did (said when the pools never come up)."""
        self.refused: dict[str, str] = {}
        """pool -> why the preflight refused its worker; not started again (same facts)."""
        self._ids = itertools.count()
        self.incarnation = secrets.token_hex(2)
        self._id_prefix = f"{self.incarnation}-" if _restarted() else ""
        """Worker ids of a first controller are `prefill-0`...; a restarted one's carry
        its incarnation, so none repeats a dead worker's."""
        self._saved = SavedPoolSizes(spec.redis_url) if spec.redis_url else None
        if self._saved is not None:
            self.desired = self._saved.restore(self.desired)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self.autoscale = None
        if spec.autoscale is not None:
            from router.cluster.autoscale.loop import AutoscaleLoop

            self.autoscale = AutoscaleLoop(
                spec.autoscale, lambda: list(self.members.values()), self.get_desired, self.scale
            )
        self._background: set[asyncio.Task] = set()
        """Reconciles and drains started from a call: the loop keeps only a weak reference
        to a task, so one nobody holds may be collected before it finishes (the likely cause
        of a scale-up that never started its worker, seen once in the suite)."""

    def _save_desired(self) -> None:
        if self._saved is not None:
            self._saved.save(self.desired)

    # -- public API (actor methods) ----------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._reconcile_forever())
            if self.autoscale is not None:
                self._spawn(self.autoscale.run_forever())

    async def wait_ready(self, timeout_s: float) -> str | None:
        """None once every pool has its desired ready workers; after `timeout_s`, why not
        (with the last worker's failure to start, when there was one)."""
        await self.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.refused:
                return "; ".join(self.refused.values())
            if all(self._count(pool, ("ready",)) >= n for pool, n in self.desired.items()):
                return None
            await asyncio.sleep(0.2)
        ready = {pool: self._count(pool, ("ready",)) for pool in self.desired}
        why = f"the pools did not come up within {timeout_s} s (ready {ready} of {self.desired})"
        now = time.time()
        waiting = [
            f"{m.worker_id} {m.state} for {now - m.started_at:.0f} s"
            for m in self.members.values()
            if m.state != "ready"
        ]
        if waiting:
            why += f"; {', '.join(waiting)}"
        if self.last_start_failure:
            why += f"; the last worker to fail said: {self.last_start_failure}"
        return why

    async def get_members(self) -> tuple[tuple[str, int], list[Member]]:
        """(incarnation, version) and the members. Starts the pools if nothing has yet: a
        front door polling a controller Ray just restarted brings its pools back."""
        await self.start()
        return (self.incarnation, self.version), list(self.members.values())

    def report_door(self, report: Any) -> None:
        """A front door's queues and recent latencies (autoscale/signals.py DoorReport)."""
        if self.autoscale is not None:
            self.autoscale.add_door(report)

    def autoscale_status(self) -> dict[str, Any] | None:
        """The autoscaler's settings and decisions; None when it is off."""
        return None if self.autoscale is None else self.autoscale.status()

    def get_spec(self) -> ClusterSpec:
        return self.spec

    def get_refused(self) -> dict[str, str]:
        """pool -> why the preflight refused its worker (core/preflight.py)."""
        return dict(self.refused)

    def get_desired(self) -> dict[str, int]:
        return dict(self.desired)

    async def scale(self, pool: str, size: int) -> dict[str, int]:
        if pool not in self.desired:
            raise ValueError(f"unknown pool {pool!r}; pools: {sorted(self.desired)}")
        if pool in self.refused:  # its workers would be refused again
            raise ValueError(f"pool {pool} is not started: {self.refused[pool]}")
        smallest = _min_size(pool)
        if not smallest <= size <= 64:
            raise ValueError(f"pool {pool} size must be in [{smallest}, 64]")
        self.desired[pool] = size
        self._save_desired()
        logger.info("controller: pool %s scaled to %d", pool, size)
        self._spawn(self._reconcile_once())
        return dict(self.desired)

    async def drain(self, worker_id: str) -> None:
        """Take one worker out of service for good (its pool shrinks by one)."""
        m = self.members.get(worker_id)
        if m is None:
            raise KeyError(f"no worker {worker_id!r}")
        if self.desired[m.role] <= _min_size(m.role):
            raise ValueError(f"pool {m.role} cannot shrink below its minimum")
        self.desired[m.role] -= 1
        self._save_desired()
        await self._drain_member(m)

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for task in list(self._background):  # the autoscaler's loop among them
            task.cancel()
        for m in list(self.members.values()):
            self._kill(m)
        self.members.clear()

    # -- reconciliation ----------------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _count(self, pool: str, states: tuple[str, ...]) -> int:
        return sum(1 for m in self.members.values() if m.role == pool and m.state in states)

    def _bump(self) -> None:
        self.version += 1

    async def _reconcile_forever(self) -> None:
        while True:
            try:
                await self._reconcile_once()
            except Exception:
                logger.exception("controller: reconcile failed")
            await asyncio.sleep(self.spec.health_interval_s)

    async def _reconcile_once(self) -> None:
        async with self._lock:
            await self._health_check()
            starts = []
            for pool, want in self.desired.items():
                if pool in self.refused:
                    continue
                have = self._count(pool, ("starting", "ready"))
                for _ in range(want - have):
                    starts.append(self._start_worker(pool))
                for m in self._pick_for_scale_down(pool, have - want):
                    self._spawn(self._drain_member(m))
        if starts:
            await asyncio.gather(*starts, return_exceptions=True)

    def _pick_for_scale_down(self, pool: str, n: int) -> list[Member]:
        if n <= 0:
            return []
        ready = [m for m in self.members.values() if m.role == pool and m.state == "ready"]
        return sorted(ready, key=lambda m: m.started_at, reverse=True)[:n]  # newest first

    async def _health_check(self) -> None:
        async def ping(m: Member) -> tuple[Member, bool]:
            return m, await self._alive(m)

        checks = [ping(m) for m in self.members.values() if m.state in ("ready", "draining")]
        for m, alive in await asyncio.gather(*checks):
            if not alive and self.members.get(m.worker_id) is m:
                logger.warning(
                    "controller: worker %s (%s) is dead; replacing it", m.worker_id, m.role
                )
                self._kill(m)
                del self.members[m.worker_id]
                self._bump()
                await self._disconnect_everywhere(m.worker_id)

    async def _start_worker(self, pool: str) -> None:
        from router.cluster.launch import launch_worker

        spec = self.spec
        worker_id = f"{pool}-{self._id_prefix}{next(self._ids)}"
        # The incarnation in the actor's name too: controllers sharing a Ray namespace (two
        # clusters, or a test session's consecutive ones) all have a `prefill-0`.
        actor_name = f"baton-{worker_id}-{self.incarnation}"
        member = Member(worker_id, pool, "starting", None, None, time.time())
        self.members[worker_id] = member
        logger.info("controller: starting %s", worker_id)
        try:
            launched = await launch_worker(spec, pool, worker_id, actor_name)
            member = replace(member, handle=launched.handle, placement=launched.placement)
            self.members[worker_id] = member
            try:
                info = await asyncio.wait_for(
                    launched.handle.info.remote(), spec.worker_start_timeout_s
                )
            except TimeoutError:  # Ray keeps an actor it cannot place pending without a word
                raise TimeoutError(
                    f"not up within {spec.worker_start_timeout_s:.0f} s (is {launched.asked}?)"
                ) from None
            self._preflight(member, info)  # then record it: no await between the two
            # Record the info before connecting: a peer that comes up concurrently then
            # sees it and connects both ways itself (add_peer is idempotent).
            member = replace(member, info=info)
            self.members[worker_id] = member
            await self._connect_peers(member, info)
        except Exception as e:
            why = str(e) if isinstance(e, TimeoutError | PreflightError) else error_message(e)
            logger.error("controller: worker %s failed to start: %s", worker_id, why)
            if isinstance(e, PreflightError | UnpairableError):
                self.refused[pool] = why
            self.last_start_failure = f"{worker_id}: {why}"
            self._kill(member)
            self.members.pop(worker_id, None)
            return
        if self.members.get(worker_id) is member:
            self.members[worker_id] = replace(member, state="ready", info=info)
            self._bump()
            logger.info(
                "controller: %s ready (pid %d, KV transport %s, %d blocks)",
                worker_id,
                info.pid,
                info.transport_backend,
                info.num_kv_blocks,
            )

    def _preflight(self, member: Member, info: Any) -> None:
        """PreflightError when the worker cannot pair with one already up (the first first)."""
        up = sorted((m for m in self.members.values() if m.info), key=lambda m: m.started_at)
        others = [(m.worker_id, m.role, m.info.facts) for m in up if m is not member]
        check_joining(member.worker_id, member.role, info.facts, others)

    async def _connect_peers(self, member: Member, info: Any) -> None:
        """Prefill workers talk to decode workers (and back, for acknowledgements), and to
        each other (prefix migration: one sends a cached prefix into another's cache):
        paired with the member (router/cluster/pairing.py)."""
        if member.role == WorkerRole.UNIFIED:
            return
        others = (
            (WorkerRole.DECODE, WorkerRole.PREFILL)
            if member.role == WorkerRole.PREFILL
            else (WorkerRole.PREFILL,)
        )
        peers = [
            m
            for m in self.members.values()
            if m.role in others
            and m is not member
            and m.worker_id != member.worker_id
            and m.info is not None
            and m.state in ("starting", "ready")
        ]
        for peer in peers:
            try:
                await pair_workers(member, peer)
            except Exception:
                # A peer that died after the last health check is the check's to replace
                # (its replacement connects to this worker then); throwing this healthy new
                # worker away for it would only start another that meets the same peer.
                if not await self._alive(member) or await self._alive(peer):
                    raise
                logger.warning(
                    "controller: %s skips %s, which died while it started",
                    member.worker_id, peer.worker_id,
                )  # fmt: skip

    async def _alive(self, m: Member) -> bool:
        try:
            await asyncio.wait_for(m.handle.ping.remote(), self.spec.health_timeout_s)
            return True
        except Exception:
            return False

    async def _disconnect_everywhere(self, worker_id: str) -> None:
        for m in self.members.values():
            if m.state == "ready":
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(m.handle.disconnect.remote(worker_id), 5.0)

    async def _drain_member(self, m: Member) -> None:
        if m.worker_id not in self.members:
            return
        self.members[m.worker_id] = replace(m, state="draining")
        self._bump()
        logger.info("controller: draining %s", m.worker_id)
        try:
            left = await asyncio.wait_for(m.handle.drain.remote(60.0), 90.0)
            if left:
                logger.warning("controller: %s drained with %d requests left", m.worker_id, left)
        except Exception as e:
            logger.warning("controller: drain of %s failed: %s", m.worker_id, e)
        self._kill(m)
        self.members.pop(m.worker_id, None)
        self._bump()
        await self._disconnect_everywhere(m.worker_id)
        logger.info("controller: %s stopped", m.worker_id)

    def _kill(self, m: Member) -> None:
        with contextlib.suppress(Exception):
            ray.kill(m.handle, no_restart=True)
        if m.placement is not None:  # also ends the worker's rank actors
            from worker.ray_ranks import remove_tp_placement

            remove_tp_placement(m.placement)


def _min_size(pool: str) -> int:
    """The prefill pool may be empty (decode workers then prefill themselves); the others
    need a worker."""
    return 0 if pool == WorkerRole.PREFILL else 1


def _restarted() -> bool:
    """Whether Ray restarted this controller (it died before); False outside an actor."""
    try:
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:
        return False
