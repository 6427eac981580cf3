"""What every worker actor shares: one engine (over `tp` ranks) on its own thread, one KV
transport per rank, and the reports the router reads (KV events, load).

At tp=1 the one rank (`rank_class`, a `worker.rank.WorkerRank`) lives in this actor; at
tp>1 the ranks are actors of the worker's placement group (`worker.ray_ranks`) driven in
lockstep by `engine.tp.TPEngine`. The worker never touches an engine directly: every call
runs on the engine thread through its `RankGroup` (see group.py), naming a method of the
rank class, so the code below is the same for both. Transfers are tracked per rank and
aggregated (tracker.py).

Plain Python: the controller wraps the role classes (`prefill_worker.worker.PrefillWorker`,
`decode_worker.worker.DecodeWorker`) with `ray.remote` when it starts them (Ray appears only
where actors start).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import time
from dataclasses import replace
from typing import Any, ClassVar

import msgspec

from core.config import EngineConfig
from core.errors import DrainingError, KVCapacityError, WorkerFailedError
from core.events import KVEventBatch, WorkerLoad
from core.request import EngineRequest
from core.tracing import SpanName, Tracing, ending
from engine.async_engine import AsyncEngine
from engine.engine import NoCapacityError
from kv_transfer import Role
from worker.event_log import EventLog
from worker.group import (
    LocalGroup,
    RankGroup,
    RouteTo,
    decode_group_metadata,
    encode_group_metadata,
    encode_routes,
)
from worker.rank import WorkerRank
from worker.records import KVReservation, WorkerInfo, WorkerReport, WorkerSpec
from worker.spans import served
from worker.threads import pin_threads
from worker.tracker import Outcome, TransferTracker

logger = logging.getLogger(__name__)
_DESCRIBE_TIMEOUT_S = 60.0


class WorkerBase:
    rank_class: ClassVar[type[WorkerRank]]

    def __init__(self, spec: WorkerSpec, placement: Any = None) -> None:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        pin_threads(spec.num_threads)
        self.spec = spec
        self.worker_id = spec.worker_id
        self.tracing = Tracing(spec.tracing, f"baton-{spec.role}")
        """This worker's own exporter (core/tracing.py says why each process has one)."""
        start = time.monotonic()
        self.config = config = self.engine_config(spec)
        """The engine's configuration, as this worker's role sets it."""
        # Built on the engine thread, which steps it (faster on CPU: see AsyncEngine).
        self.engine = AsyncEngine(lambda: self._start_ranks(spec, config, placement))  # type: ignore[arg-type,return-value]
        self.group: RankGroup = self.engine.engine  # type: ignore[assignment]

        def describe(g: RankGroup) -> WorkerInfo:
            metadata = encode_group_metadata(spec.worker_id, g.each(WorkerRank.kv_metadata))
            return g.first(WorkerRank.describe, metadata, os.getpid())

        self._info: WorkerInfo = self.engine.submit(describe).result(_DESCRIBE_TIMEOUT_S)
        self.tracker = TransferTracker(spec.tp)
        self.engine.after_step.append(self._after_step)
        rank = getattr(self.group, "rank", None)  # tp=1: the rank's transport is in-process
        if rank is not None:
            # A transfer's end is taken at once, not at the idle loop's next look (20 ms):
            # an idle decode worker admits a prompt the moment its KV landed.
            rank.transport.on_results(self.engine.wake)
        self.events = EventLog()
        self.draining = False
        self._arrivals: dict[str, concurrent.futures.Future[str | None]] = {}
        """request id -> resolves when every rank reported its RECV (None: all ok)."""
        logger.info("worker %s (%s, tp=%d) ready in %.1f s", spec.worker_id, spec.role, spec.tp,
                    time.monotonic() - start)  # fmt: skip

    @classmethod
    def engine_config(cls, spec: WorkerSpec) -> EngineConfig:
        """The engine's configuration on this kind of worker."""
        return replace(spec.engine, tp_size=spec.tp)

    def _start_ranks(self, spec: WorkerSpec, config: EngineConfig, placement: Any) -> RankGroup:
        rank = functools.partial(self.rank_class, spec, config)
        if spec.tp == 1:
            return LocalGroup(rank())  # the fast path: no extra process
        from engine.config import ModelConfig
        from engine.tp import TPEngine, check_tp_size
        from worker.ray_ranks import start_ray_ranks

        check_tp_size(ModelConfig.from_dir(spec.model_dir), spec.tp)
        ranks = start_ray_ranks(spec.tp, config.device, rank, placement)
        return TPEngine(spec.model_dir, config, spec.worker_id, ranks=ranks)

    def _check_admitting(self) -> None:
        if self.draining:
            raise DrainingError(f"{self.worker_id} is draining")

    # -- transfers (engine thread) -----------------------------------------------------------
    def _after_step(self) -> None:
        """Engine thread, after every step: collect each rank's finished transfers."""
        if not self.tracker.pending:
            return
        g = self.group
        cancel, done = self.tracker.feed(g.each(WorkerRank.kv_poll))
        for request_id in cancel:  # one rank failed: stop the others quickly
            g.each(WorkerRank.kv_cancel, request_id)
        for outcome in done:
            self._on_transfer_done(outcome)
            self.tracker.resolve(outcome)

    def _on_transfer_done(self, outcome: Outcome) -> None:
        """Every rank reported on a request's transfer: act on all ranks at once."""
        if outcome.error is not None:
            logger.warning("%s: transfer of %s failed: %s", self.worker_id, outcome.request_id,
                           outcome.error)  # fmt: skip
        if outcome.role is Role.RECV:
            self.group.all(WorkerRank.kv_ended, outcome.request_id)  # a landing area's blocks
            if outcome.error is not None or outcome.abandoned:
                self.group.all(WorkerRank.abort, outcome.request_id)  # frees the reservation

    # -- actor methods shared by both kinds --------------------------------------------------
    def info(self) -> WorkerInfo:
        return self._info

    async def connect(self, peer_metadata: bytes) -> str:
        """Connect each rank to the matching rank of a peer worker of this pool (same TP
        size: prefix migration between prefill workers)."""
        meta = decode_group_metadata(peer_metadata, self.worker_id, self.spec.tp)
        await self.engine.call(lambda g: g.each(WorkerRank.kv_add_peer, meta.ranks))
        return meta.worker_id

    async def accept(self, sender_metadata: bytes) -> bytes:
        """Take prompts' KV from a sender worker of any TP size and layout (its
        `transport_metadata`): every rank connects to the sender ranks that hold its heads,
        straight or through landing areas (worker/landing.py). Returns the `Routes` the
        sender connects by (`PrefillWorker.route`)."""
        meta = decode_group_metadata(sender_metadata, self.worker_id, None)
        answers = await self.engine.call(
            lambda g: g.each(WorkerRank.kv_accept, meta.worker_id, meta.ranks)
        )
        routes: list[list[RouteTo]] = [[] for _ in meta.ranks]
        for rank, (lands, per_sender_rank) in enumerate(answers):
            for sender_rank, metadata in per_sender_rank.items():
                routes[sender_rank].append(RouteTo(metadata, rank if lands else None))
        return encode_routes(self.worker_id, routes)

    async def disconnect(self, peer: str) -> None:
        await self.engine.call(lambda g: g.each(WorkerRank.kv_remove_peer, peer))

    async def report(self, after_seq: int = -1) -> WorkerReport:
        """The KV-event batches after `after_seq` (every front door reads all of them: see
        event_log.py; a snapshot when they are no longer kept) and the load."""

        def report(g: RankGroup) -> WorkerReport:
            load = self._take_load(g)
            batches = self.events.since(after_seq)
            if batches is None:
                batches = [self._snapshot(g)]
            return WorkerReport(batches, load)

        return await self.engine.call(report)

    async def load(self) -> WorkerLoad:
        """The load alone (the autoscaler's read; the KV events stay in the log for the
        front doors)."""
        return await self.engine.call(self._take_load)

    def _take_load(self, g: RankGroup) -> WorkerLoad:
        """Engine thread: the load now, with this worker's role and the serving loop's time
        between steps; the KV events since the last read go to the log."""
        events, load = g.all(WorkerRank.report_state)
        if events is not None:
            self.events.append(events)
        steps = msgspec.structs.replace(load.steps, between_s=self.engine.between_s)
        return msgspec.structs.replace(load, role=str(self.spec.role), steps=steps)

    async def snapshot(self) -> KVEventBatch:
        """Everything cached here, as one batch that replaces a reader's view."""
        return await self.engine.call(self._snapshot)

    def _snapshot(self, g: RankGroup) -> KVEventBatch:
        events = g.all(WorkerRank.report_state)[0]  # before the snapshot: its seq comes after
        if events is not None:
            self.events.append(events)
        snapshot = g.all(WorkerRank.kv_snapshot)
        self.events.append(snapshot)  # every reader's sequence stays without gaps
        return snapshot

    async def reserve(self, request: EngineRequest, timeout_s: float, sender: str) -> KVReservation:
        """Reserve blocks for the prompt and arm every rank's transport to receive its KV
        heads from worker `sender`. Blocks this worker already caches for the prefix are
        reused: the sender skips them. The block ids are the same on every rank (lockstep
        schedulers)."""
        self._check_admitting()
        request_id = request.request_id

        def reserve(g: RankGroup) -> KVReservation:
            res = g.all(WorkerRank.reserve, request, timeout_s, sender)
            self._arrivals[request_id] = self.tracker.add(request_id, Role.RECV)
            return res

        span = served(
            self.tracing, request.trace, SpanName.RESERVE, **{"baton.worker": self.worker_id}
        )
        with ending(span):
            try:
                reservation = await self.engine.call(reserve)
            except NoCapacityError as e:
                raise KVCapacityError(f"{self.worker_id}: {e}") from e
            if span.is_recording():
                span.set_attributes({
                    "baton.blocks": reservation.num_blocks,
                    "baton.cached_tokens": reservation.num_cached_tokens,
                })  # fmt: skip
            return reservation

    async def _kv_arrived(self, request_id: str, timeout_s: float) -> None:
        """Wait until every rank received every layer into the request's reservation;
        WorkerFailedError (the reservation freed) if that failed or took too long."""
        arrival = self._arrivals.pop(request_id, None)
        if arrival is None:
            raise WorkerFailedError(f"no reservation waiting for KV under {request_id!r}")
        try:
            error = await asyncio.wait_for(asyncio.wrap_future(arrival), timeout_s)
        except TimeoutError as e:
            await self.abort(request_id)
            raise WorkerFailedError(
                f"KV for {request_id} did not arrive within {timeout_s} s"
            ) from e
        if error is not None:  # the reservation was already freed on every rank
            raise WorkerFailedError(f"KV transfer for {request_id} failed: {error}")

    async def abort(self, request_id: str) -> bool:
        """The one way a request leaves this worker early: what the actor keeps for it goes
        (`_forget`), then, on the engine thread, its blocks or its transfer (`_abort`)."""
        self._forget(request_id)
        return await self.engine.call(lambda g: self._abort(g, request_id))

    def _forget(self, request_id: str) -> None:
        """Drop what this actor keeps for the request (each role adds what it keeps)."""
        self._arrivals.pop(request_id, None)

    def _abort(self, g: RankGroup, request_id: str) -> bool:
        """Engine thread: free the request's blocks, or, while its KV transfer may still
        write them (a reservation) or be reading them (a prefilled prompt), cancel the
        transfer and leave the freeing to its outcome (`_on_transfer_done`): a block freed
        earlier could be given to another request and then overwritten by a late pull, or
        overwritten itself while a reader still copies it."""
        if g.first(WorkerRank.is_parked, request_id) and self.tracker.abandon(request_id):
            g.each(WorkerRank.kv_cancel, request_id)
            return True
        self.tracker.discard(request_id)
        return g.all(WorkerRank.abort, request_id)

    def rank_actors(self) -> list[Any]:
        """The Ray actors of this worker's ranks (none at tp=1), for operators and tests."""
        return [r.actor for r in getattr(self.group, "ranks", []) if hasattr(r, "actor")]

    def ping(self) -> str:
        if self.group.broken:  # the controller then replaces this worker
            raise WorkerFailedError(f"{self.worker_id}: {self.group.broken}")
        if self.engine.error is not None:  # every step keeps failing
            raise WorkerFailedError(f"{self.worker_id}: engine failing: {self.engine.error}")
        return self.worker_id

    async def drain(self, timeout_s: float = 60.0) -> int:
        """Stop admitting, wait for running requests to finish; returns how many were left
        when the timeout hit (0: clean)."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            left = await self.engine.call(lambda g: g.first(WorkerRank.num_in_flight))
            if left == 0:
                return 0
            await asyncio.sleep(0.05)
        return await self.engine.call(lambda g: g.first(WorkerRank.num_in_flight))

    def flush_traces(self, timeout_s: float = 10.0) -> bool:
        """Send this worker's finished spans now (tests; a clean stop)."""
        return self.tracing.flush(timeout_s)

    def shutdown(self) -> None:
        self.tracing.shutdown()
        self.engine.stop()
        self.group.shutdown()
