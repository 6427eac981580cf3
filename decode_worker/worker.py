"""The decode worker actor (also the `unified` worker: same class, both phases).

Request paths it serves:
  disaggregated   reserve() -> [prefill worker writes KV] -> admit()
  on this worker  generate() (conditional disaggregation, unified mode)
Either way the deltas go to the caller's output channel: `outputs(channel_id)`, one
long-lived stream per front door that carries a batch per engine step (worker/outlets.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry.trace import INVALID_SPAN, set_span_in_context

from core.errors import WorkerFailedError
from core.request import EngineRequest, TokenLogprob
from core.tracing import Carried, SpanName, ending
from decode_worker.rank import DecodeRank
from engine.output_channel import Item
from worker.base import WorkerBase
from worker.group import RankGroup
from worker.outlets import Outlets
from worker.records import WorkerSpec
from worker.spans import served

logger = logging.getLogger(__name__)

STREAMS_END_S = 5.0
"""How long a drained worker waits for its output streams to send their last items and end."""


class DecodeWorker(WorkerBase):
    rank_class = DecodeRank

    def __init__(self, spec: WorkerSpec, placement: Any = None) -> None:
        super().__init__(spec, placement)
        self._outlets = Outlets()
        self._ending_streams = False
        """Drained, nothing in flight: each output stream ends once it has sent all it had."""

    async def drain(self, timeout_s: float = 60.0) -> int:
        """`WorkerBase.drain`; then, with nothing left in flight, each output stream ends
        once its last items went out, so every front door has each token before the
        controller stops this worker (a stream cut by the stop has its door retry a request
        this worker finished). Nothing reserved is left to admit: no channel is needed."""
        left = await super().drain(timeout_s)
        if left:
            return left
        self._ending_streams = True
        self._outlets.wake_all()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STREAMS_END_S
        while len(self._outlets) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return 0

    # -- output channels ----------------------------------------------------------------------
    async def outputs(
        self, channel_id: str, report_every_s: float | None = None, after_seq: int = -1
    ) -> AsyncIterator[list[Item]]:
        """Channel `channel_id`'s stream: a list of (request id, delta or error) per engine
        step, for as long as the caller reads it. When it ends (the caller is gone or
        cancelled it), the requests still open on it are aborted.

        With `report_every_s`, a batch also carries this worker's report, at most that often,
        as the item ("", WorkerReport): its load and the KV events after those the channel
        has had (the first report: after `after_seq`, the caller's last). A front door reading
        the stream then needs no `report` call while steps run: polled 20 times a second,
        those calls cost the engine ~4.6% of its rate past saturation. The report is asked of
        the engine thread after a batch goes out and rides the next one, so no batch waits
        for it; while the worker does not step for this channel, none comes (the door polls
        it)."""
        outlet = self._outlets.get(channel_id)
        outlet.cursor = max(outlet.cursor, after_seq)
        loop = asyncio.get_running_loop()
        asked_at, asked = -math.inf, None
        try:
            while True:
                batch = await outlet.next_batch(self._abort_soon)
                stepped = bool(batch)  # before a report joins it
                if asked is not None and asked.done():
                    report = None if asked.cancelled() or asked.exception() else asked.result()
                    asked = None
                    if report is not None:
                        if report.events:
                            outlet.cursor = report.events[-1].seq
                        batch.append(("", report))
                if batch:
                    yield batch
                due = report_every_s is not None and loop.time() - asked_at >= report_every_s
                if due and asked is None and stepped:  # an idle worker's channel: polled
                    asked_at = loop.time()
                    asked = asyncio.ensure_future(self.report(outlet.cursor))
                if self._ending_streams and not outlet.open_requests and not batch:
                    return  # drained: all it carried went out
        finally:
            if asked is not None:
                asked.cancel()
            self._outlets.drop(channel_id)
            for request_id in outlet.open_requests:
                self._abort_soon(request_id)

    def _open(self, request_id: str, timeout_s: float, channel_id: str) -> None:
        outlet = self._outlets.get(channel_id)
        outlet.watch(request_id, timeout_s)
        self.engine.open_stream(request_id, outlet.channel)

    def _forget(self, request_id: str) -> None:
        """Stop routing the request's outputs, watching its deadline, expecting its KV."""
        self._outlets.forget(request_id)
        self.engine.close_stream(request_id)
        super()._forget(request_id)

    def _abort_soon(self, request_id: str) -> None:
        """Abort without waiting (from the channel's stream, which must not block)."""
        self._forget(request_id)
        self.engine.submit(lambda g: self._abort(g, request_id))

    async def admit(
        self,
        request_id: str,
        first_token: int,
        logprob: TokenLogprob | None,
        timeout_s: float,
        channel_id: str,
        trace: Carried | None = None,
    ) -> None:
        """Wait until every rank received every layer of the prompt's KV, then join the
        running batch; its deltas (the first carries the first token) go to channel
        `channel_id` until the request finishes. `trace`: the router's admit span."""
        span = served(self.tracing, trace, SpanName.ADMIT, **{"baton.worker": self.worker_id})
        with ending(span):
            waited = self.tracing.tracer.start_span(
                SpanName.KV_WAIT, context=set_span_in_context(span)
            ) if span.is_recording() else INVALID_SPAN  # fmt: skip
            with ending(waited):
                await self._kv_arrived(request_id, timeout_s)
            self._open(request_id, timeout_s, channel_id)

            def admit(g: RankGroup) -> None:
                out = g.all(DecodeRank.admit, request_id, first_token, logprob)
                self.engine.publish([(request_id, out)])  # engine thread: before any step's

            try:
                await self.engine.call(admit)
            except KeyError as e:
                self._forget(request_id)
                raise WorkerFailedError(str(e)) from e

    async def generate(self, request: EngineRequest, timeout_s: float, channel_id: str) -> None:
        """Prefill and decode here (unified mode; conditional disaggregation); the deltas go
        to channel `channel_id`."""
        self._check_admitting()
        self._open(request.request_id, timeout_s, channel_id)
        span = served(
            self.tracing, request.trace, SpanName.PREFILL, **{"baton.worker": self.worker_id}
        )
        try:
            with ending(span):
                await self.engine.call(lambda g: g.all(DecodeRank.enqueue, request))
        except BaseException:
            # Cancelled or timed out while the engine thread enqueues it, the request is
            # queued anyway: abort it after (commands run in order; a refused one is a no-op).
            self._abort_soon(request.request_id)
            raise
