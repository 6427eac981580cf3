"""The chaos driver: streaming load on a running cluster while workers are killed
at seeded moments and some clients hang up mid-stream; every request's outcome is judged
against its fault-free stream (bench/chaos/workload.py).

Used by tests/chaos (a short seeded run) and bench/chaos/soak.py (minutes, a kill every ~20 s).

    outcome        meaning                                                  fine?
    exact          finished, every chunk (token ids, text) = the reference  yes
    hung_up        the client closed early; what it got is a reference prefix  yes
    clean_error    a core.errors exception, before deadline + grace          yes
    differs        a chunk differs from the reference                        no
    bad_error      an exception that is not a core.errors one                no
    hung           no answer by deadline + grace                              no

Kills come either after every `kill_every_tokens` streamed tokens (seeded jitter: the test,
repeatable whatever the machine's speed) or every `kill_every_s` seconds (the soak). A kill
waits until the victim's pool is back at its desired size, so kills test recovery rather than
pile up on a pool with nothing left. Each round of kills hits every role in `kill_roles` once,
in a seeded order; the victim is drawn from that role's ready workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import ray

from bench.chaos.workload import Chunks, RequestSpec
from core.errors import BatonError
from router.frontdoor.backend import GenerateRequest

OUTCOMES = ("exact", "hung_up", "clean_error", "differs", "bad_error", "hung")
BAD = ("differs", "bad_error", "hung")


@dataclass(frozen=True)
class ChaosPlan:
    seed: int = 0
    num_requests: int | None = 24
    """At least this many requests, and on until `max_kills` kills are done (None: run for
    `duration_s`)."""
    duration_s: float | None = None
    """At most this long (None: no limit)."""
    concurrency: int = 6
    timeout_s: float = 90.0
    """Each request's deadline."""
    grace_s: float = 20.0
    """How long past its deadline a request may take to fail before it counts as hung."""
    kill_roles: tuple[str, ...] = ("prefill", "decode")
    kill_every_tokens: int | None = 150
    kill_every_s: float | None = None
    max_kills: int | None = None
    hang_up_share: float = 0.15
    """Share of clients that close their stream after a seeded number of chunks."""


@dataclass
class ChaosReport:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    kills: list[tuple[float, str]] = field(default_factory=list)
    """(seconds into the run, worker id) of every kill."""
    problems: list[str] = field(default_factory=list)
    """One line per bad outcome: request, what happened."""
    errors: dict[str, int] = field(default_factory=dict)
    """Clean errors by type."""
    num_tokens: int = 0
    wall_s: float = 0.0

    @property
    def num_requests(self) -> int:
        return sum(self.counts.values())

    @property
    def ok(self) -> bool:
        return not any(self.counts[k] for k in BAD)

    def summary(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in self.counts.items())
        return (
            f"{self.num_requests} requests, {len(self.kills)} kills, {self.num_tokens} tokens "
            f"in {self.wall_s:.0f} s: {counts}; errors {self.errors}"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "num_requests": self.num_requests, "num_kills": len(self.kills)}


def judge(got: Chunks, want: Chunks, hung_up: bool) -> str | None:
    """None when `got` is `want` (or, for a client that hung up, its prefix); else what
    differs."""
    expected = want[: len(got)] if hung_up else want
    if got == expected:
        return None
    i = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    if i is None:
        return f"{len(got)} chunks, the reference has {len(expected)}"
    return f"chunk {i}: got {got[i]!r}, want {expected[i]!r}"


class ChaosRun:
    def __init__(
        self,
        cluster: Any,
        specs: list[RequestSpec],
        references: dict[str, Chunks],
        plan: ChaosPlan,
    ) -> None:
        self.cluster = cluster
        self.specs = specs
        self.references = references
        self.plan = plan
        self.report = ChaosReport()
        self._rng = random.Random(plan.seed)
        self._next = 0
        self._start = 0.0
        self._killing = False
        self._killed: set[str] = set()
        self._stopped = False

    def stop(self) -> None:
        """Start no more requests (those under way finish)."""
        self._stopped = True

    async def run(self) -> ChaosReport:
        """The load and the killer, until the plan's requests are done (or its time is up)."""
        self._start = time.monotonic()
        done = asyncio.Event()
        self._killing = True
        killer = asyncio.create_task(self._kill_forever(done))
        try:
            await asyncio.gather(*(self._client() for _ in range(self.plan.concurrency)))
        finally:
            done.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(killer, 60)
            self.report.wall_s = time.monotonic() - self._start
        return self.report

    def _more(self) -> bool:
        plan = self.plan
        if self._stopped:
            return False
        if plan.duration_s is not None and time.monotonic() - self._start >= plan.duration_s:
            return False
        if plan.num_requests is None:
            return True
        kills_left = plan.max_kills is not None and len(self.report.kills) < plan.max_kills
        return self._next < plan.num_requests or (kills_left and self._killing)

    async def _client(self) -> None:
        while self._more():
            i = self._next
            self._next += 1
            spec = self._rng.choice(self.specs)
            hang_up = None
            if self._rng.random() < self.plan.hang_up_share:
                hang_up = self._rng.randint(1, max(1, spec.params.max_tokens - 1))
            await self._one(f"{spec.name}-r{i}", spec, hang_up)

    async def _one(self, rid: str, spec: RequestSpec, hang_up: int | None) -> None:
        plan, report = self.plan, self.report
        got: Chunks = []
        request = GenerateRequest(rid, list(spec.prompt), spec.params, plan.timeout_s)
        stream = self.cluster.backend.generate(request)
        limit = asyncio.timeout(plan.timeout_s + plan.grace_s)
        outcome = "exact"
        try:
            async with limit:
                async for delta in stream:
                    got.append((tuple(delta.new_token_ids), delta.new_text))
                    report.num_tokens += 1
                    if hang_up is not None and len(got) >= hang_up:
                        outcome = "hung_up"
                        break
        except TimeoutError as e:
            if not limit.expired():
                outcome = "bad_error"
                report.problems.append(f"{rid}: a bare TimeoutError: {e!r}")
            else:
                outcome = "hung"
                report.problems.append(f"{rid}: no answer within {plan.timeout_s + plan.grace_s} s")
        except BatonError as e:
            outcome = "clean_error"
            name = type(e).__name__
            report.errors[name] = report.errors.get(name, 0) + 1
        except Exception as e:
            outcome = "bad_error"
            report.problems.append(f"{rid}: not a core.errors error: {type(e).__name__}: {e}")
        finally:
            with contextlib.suppress(Exception):  # a client going away cancels the request
                await asyncio.wait_for(stream.aclose(), 30)
        if outcome in ("exact", "hung_up"):
            why = judge(got, self.references[spec.name], outcome == "hung_up")
            if why is not None:
                outcome = "differs"
                report.problems.append(f"{rid} ({spec.kind}, prompt {spec.text!r}): {why}")
        report.counts[outcome] += 1

    # -- the killer ----------------------------------------------------------------------
    async def _kill_forever(self, done: asyncio.Event) -> None:
        try:
            await self._kill_until(done)
        finally:
            self._killing = False

    async def _kill_until(self, done: asyncio.Event) -> None:
        plan = self.plan
        rng = random.Random(plan.seed + 1)
        if plan.kill_every_tokens is None and plan.kill_every_s is None:
            return
        roles: list[str] = []
        while plan.max_kills is None or len(self.report.kills) < plan.max_kills:
            jitter = rng.uniform(0.5, 1.5)
            at_tokens = self.report.num_tokens + int((plan.kill_every_tokens or 0) * jitter)
            at_time = time.monotonic() + (plan.kill_every_s or 0.0) * jitter
            while not self._due(at_tokens, at_time):
                if done.is_set():
                    return
                await asyncio.sleep(0.02)
            if not roles:  # each round kills every role once, in a seeded order
                roles = rng.sample(plan.kill_roles, len(plan.kill_roles))
            role = roles.pop()
            victims = await self._ready_pool(role, done)
            if not victims:
                return
            victim = rng.choice(victims)
            ray.kill(victim.handle, no_restart=True)
            self._killed.add(victim.worker_id)
            self.report.kills.append((round(time.monotonic() - self._start, 2), victim.worker_id))

    def _due(self, at_tokens: int, at_time: float) -> bool:
        if self.plan.kill_every_tokens is not None:
            return self.report.num_tokens >= at_tokens
        return time.monotonic() >= at_time

    async def _ready_pool(self, role: str, done: asyncio.Event) -> list[Any]:
        """The ready workers of `role` not yet killed, once the pool is at its desired size
        without those (sorted by id: the seeded choice among them is repeatable); [] if the
        run ends first."""
        controller = self.cluster.controller
        while not done.is_set():
            _, members = await asyncio.wait_for(controller.get_members.remote(), 30)
            desired = await asyncio.wait_for(controller.get_desired.remote(), 30)
            ready = sorted(
                (
                    m
                    for m in members
                    if m.role == role and m.state == "ready" and m.worker_id not in self._killed
                ),
                key=lambda m: m.worker_id,
            )
            if ready and len(ready) >= desired.get(role, 0):
                return ready
            await asyncio.sleep(0.1)
        return []


async def settle(cluster: Any, timeout_s: float = 120.0) -> None:
    """Wait (bounded) until the cluster is back where it started: every pool at its desired
    size with every ready worker routed to, every worker's KV free (nothing running, waiting
    or reserved: free blocks = total blocks), and no ticket left open in the router.
    Raises AssertionError saying what is still off."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    since = time.time()  # the loads' clock: reports from before now may be stale
    why = ""
    while loop.time() < deadline:
        why = await _unsettled(cluster, since)
        if not why:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the cluster did not settle within {timeout_s} s: {why}")


async def _unsettled(cluster: Any, since: float) -> str:
    _, members = await asyncio.wait_for(cluster.controller.get_members.remote(), 30)
    desired = await asyncio.wait_for(cluster.controller.get_desired.remote(), 30)
    ready = {m.worker_id for m in members if m.state == "ready"}
    by_pool = {p: sum(1 for m in members if m.role == p and m.state == "ready") for p in desired}
    if by_pool != desired or {m.state for m in members} != {"ready"}:
        return (
            f"pools {by_pool} ({sorted((m.worker_id, m.state) for m in members)}), want {desired}"
        )
    routed = set(cluster.membership.workers)
    if routed != ready:
        return f"the front door routes to {sorted(routed)}, the ready workers are {sorted(ready)}"
    loads = cluster.membership.loads
    for worker_id in sorted(ready):
        load = loads.get(worker_id)
        if load is None or load.timestamp < since:
            return f"no fresh report from {worker_id} yet"
        if load.num_running or load.num_waiting or load.num_free_blocks != load.num_total_blocks:
            return (
                f"{worker_id}: {load.num_running} running, {load.num_waiting} waiting, "
                f"{load.num_free_blocks} of {load.num_total_blocks} blocks free"
            )
    if cluster.router.num_in_flight:
        return f"the router still counts {cluster.router.num_in_flight} requests in flight"
    return ""
