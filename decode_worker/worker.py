"""The decode worker actor (also the `unified` worker: same class, both phases).

Request paths it serves:
  disaggregated   reserve() -> [prefill worker writes KV] -> admit()
  on this worker  generate() (conditional disaggregation, unified mode)
Either way the deltas go to the caller's output channel: `outputs(channel_id)`, one
long-lived stream per front door that carries a batch per engine step (worker/outlets.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from core.errors import WorkerFailedError
from core.request import EngineRequest, TokenLogprob
from core.roles import WorkerRole
from decode_worker.rank import DecodeRank
from engine.output_channel import Item
from worker.base import WorkerBase
from worker.group import EngineGroup
from worker.outlets import Outlets
from worker.records import WorkerSpec

logger = logging.getLogger(__name__)


class DecodeWorker(WorkerBase):
    engine_role = WorkerRole.UNIFIED
    rank_class = DecodeRank

    def __init__(self, spec: WorkerSpec, placement: Any = None) -> None:
        super().__init__(spec, placement)
        self._outlets = Outlets()

    # -- output channels ----------------------------------------------------------------------
    async def outputs(self, channel_id: str) -> AsyncIterator[list[Item]]:
        """Channel `channel_id`'s stream: a list of (request id, delta or error) per engine
        step, for as long as the caller reads it. When it ends (the caller is gone or
        cancelled it), the requests still open on it are aborted."""
        outlet = self._outlets.get(channel_id)
        try:
            while True:
                batch = await outlet.next_batch(self._abort_soon)
                if batch:
                    yield batch
        finally:
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
        self._arrivals.pop(request_id, None)

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
    ) -> None:
        """Wait until every rank received every layer of the prompt's KV, then join the
        running batch; its deltas (the first carries the first token) go to channel
        `channel_id` until the request finishes."""
        await self._kv_arrived(request_id, timeout_s)
        self._open(request_id, timeout_s, channel_id)

        def admit(g: EngineGroup) -> None:
            out = g.call_all("admit_transferred", request_id, first_token, logprob)
            self.engine.publish([(request_id, out)])  # on the engine thread: before any step's

        try:
            await self.engine.call(admit)
        except KeyError as e:
            self._forget(request_id)
            raise WorkerFailedError(str(e)) from e

    async def abort(self, request_id: str) -> bool:
        self._forget(request_id)
        return await super().abort(request_id)

    async def generate(self, request: EngineRequest, timeout_s: float, channel_id: str) -> None:
        """Prefill and decode here (unified mode; conditional disaggregation); the deltas go
        to channel `channel_id`."""
        self._check_admitting()
        self._open(request.request_id, timeout_s, channel_id)
        try:
            await self.engine.call(lambda g: g.call_all("enqueue", request))
        except BaseException:
            # Cancelled or timed out while the engine thread enqueues it, the request is
            # queued anyway: abort it after (commands run in order; a refused one is a no-op).
            self._abort_soon(request.request_id)
            raise
