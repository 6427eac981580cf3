"""The front door's report polls back off while nothing runs and come back at once when a
request starts (router/cluster/membership.py): an idle cluster's polls cost the engines CPU."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgspec

from core.events import KVEventBatch, WorkerLoad
from core.roles import WorkerRole
from router.cluster import membership as membership_module
from router.cluster.membership import Membership
from router.routing.route import Router
from tests.router.membership_fakes import Call, Member
from worker.records import WorkerInfo, WorkerReport


def _load(running: int = 0, waiting_tokens: int = 0) -> WorkerLoad:
    return WorkerLoad("unified-0", WorkerRole.UNIFIED, running, 0, waiting_tokens, 100, 100)


@dataclass
class _Worker:
    """A worker handle whose `report` counts its calls."""

    load: WorkerLoad = field(default_factory=_load)
    calls: int = 0
    called: asyncio.Event | None = None

    @property
    def report(self) -> _Worker:
        return self

    def remote(self, *_: Any) -> Any:
        async def answer() -> WorkerReport:
            self.calls += 1
            if self.called is not None:
                self.called.set()
            return WorkerReport([], self.load)

        return answer()


class _Controller:
    def __init__(self, worker: _Worker) -> None:
        info = WorkerInfo(
            "unified-0", WorkerRole.UNIFIED, "m", 1000, 16, 64, 512, 1024, "local", b"", 1
        )
        members = [Member("unified-0", WorkerRole.UNIFIED, "ready", info, worker)]
        self.get_members = Call((("a", 1), members))
        self.get_desired = Call({WorkerRole.UNIFIED: 1})


def test_idle_polls_back_off_and_work_or_a_request_restores_them(monkeypatch) -> None:
    monkeypatch.setattr(membership_module, "_IDLE_POLL_MAX_S", 0.4)
    router = Router()
    membership = Membership(_Controller(_Worker()), router, poll_interval_s=0.05)
    membership.loads["unified-0"] = _load()
    naps = [0.05]
    for _ in range(5):
        naps.append(membership._next_interval(naps[-1]))
    assert naps == [0.05, 0.1, 0.2, 0.4, 0.4, 0.4]
    membership.loads["unified-0"] = _load(running=2)  # decoding
    assert membership._next_interval(0.4) == 0.05
    membership.loads["unified-0"] = _load(waiting_tokens=300)  # a prompt queued
    assert membership._next_interval(0.4) == 0.05
    membership.loads["unified-0"] = _load()
    membership.wake()  # a request started here, before any worker reports it
    assert membership._next_interval(0.4) == 0.05
    router.close()


def test_a_request_ends_an_idle_nap() -> None:
    worker = _Worker()
    router = Router()
    membership = Membership(_Controller(worker), router, poll_interval_s=0.01)
    membership._next_interval = lambda interval: (  # type: ignore[method-assign]
        0.01 if membership._woken.is_set() else 60.0  # idle: a nap no test would outwait
    )

    async def run() -> None:
        worker.called = asyncio.Event()
        await membership.start()
        await asyncio.wait_for(worker.called.wait(), 5.0)  # the first poll, then the nap
        worker.called.clear()
        await asyncio.sleep(0.1)
        assert worker.calls == 1
        membership.wake()
        await asyncio.wait_for(worker.called.wait(), 5.0)
        assert worker.calls == 2
        await membership.close()

    asyncio.run(run())
    router.close()


def test_reports_over_the_output_channel_apply_once_and_pause_that_workers_polls(
    monkeypatch,
) -> None:
    """A report that rode the worker's output channel (router/cluster/worker_channel.py) is
    applied like a polled one, and the two can cross: a KV-event batch already applied is
    not applied again (but a worker's seq 0 is: it clears, as a restart's does), a load older
    than the last is dropped. While such reports come the worker is not polled."""
    worker = _Worker()
    router = Router()
    membership = Membership(_Controller(worker), router, poll_interval_s=0.01)
    applied: list[int] = []
    loads: list[float] = []
    router.apply = lambda batch: applied.append(batch.seq)  # type: ignore[method-assign]
    router.report_load = lambda load: loads.append(load.timestamp)  # type: ignore[method-assign]

    def report(seqs: list[int], at: float) -> WorkerReport:
        batches = [KVEventBatch("unified-0", seq, []) for seq in seqs]
        return WorkerReport(batches, msgspec.structs.replace(_load(), timestamp=at))

    async def run() -> None:
        await membership.sync()
        membership.take_report("unified-0", report([0, 1], at=2.0))
        membership.take_report("unified-0", report([1, 2], at=1.0))  # a poll's, overtaken
        assert applied == [0, 1, 2] and loads == [2.0] and membership.cursor("unified-0") == 2
        membership.take_report("unified-0", report([0], at=3.0))
        assert applied == [0, 1, 2, 0] and loads == [2.0, 3.0]
        await membership.poll_reports()
        assert worker.calls == 0
        monkeypatch.setattr(membership_module, "_STREAMED_FRESH_S", 0.0)  # they stopped
        await membership.poll_reports()
        assert worker.calls == 1

    asyncio.run(run())
    router.close()


def test_a_gap_in_a_workers_events_is_counted_as_an_index_resync() -> None:
    """What `Cluster.use_metrics` wires: the index's resync request reaches the metrics
    (baton:router_index_resyncs_total) and the next poll re-reads the worker's cache."""
    from core.events import BlockStored
    from router.frontdoor.metrics import Metrics

    router = Router()
    router.add_worker("unified-0", WorkerRole.UNIFIED, "m")
    membership = Membership(_Controller(_Worker()), router, poll_interval_s=0.05)
    metrics = Metrics()
    membership.on_resync.append(metrics.record_index_resync)
    router.apply(KVEventBatch("unified-0", 0, [BlockStored(None, [1, 2])], model="m"))
    router.apply(KVEventBatch("unified-0", 3, [BlockStored(2, [3])], model="m"))  # 1, 2 lost
    resyncs = metrics.registry.get_sample_value(
        "baton:router_index_resyncs_total", {"worker": "unified-0"}
    )
    assert resyncs == 1
    assert membership._resync == {"unified-0"}
    router.close()


def test_close_ends_the_poll_loop_when_a_wake_meets_the_cancellation() -> None:
    """A request that starts as the door closes wakes the loop's nap in the same tick as the
    cancellation: on Python 3.11 `asyncio.wait_for` then returns instead of raising, and close
    must still end the loop (it once waited out its caller's 60-s bound)."""
    controller = type("Controller", (), {})()
    controller.get_desired = Call({WorkerRole.DECODE: 1})
    controller.get_members = Call((("a", 1), []))
    router = Router()
    membership = Membership(controller, router, poll_interval_s=0.01)

    async def run() -> None:
        await membership.start()
        await asyncio.sleep(0.1)  # napping in wait_for(woken.wait(), interval)
        membership.wake()
        closing = asyncio.ensure_future(membership.close())
        done, _ = await asyncio.wait({closing}, timeout=5)  # it does not cancel `closing`
        if not done:
            closing.cancel()
        assert closing in done, "close() did not end the poll loop"

    for _ in range(5):
        membership = Membership(controller, router, poll_interval_s=0.01)
        asyncio.run(run())
    router.close()
