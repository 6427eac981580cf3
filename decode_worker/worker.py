"""The decode worker actor (also the `unified` worker: same class, both phases).

Request paths it serves:
  disaggregated   reserve() -> [prefill worker writes KV] -> admit()
  on this worker  generate() (conditional disaggregation, unified mode)
Either way the deltas go to the caller's output channel: `outputs(channel_id)`, one
long-lived stream per front door that carries a batch per engine step (worker/outlets.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import AsyncIterator
from typing import Any

from core.errors import KVCapacityError, WorkerFailedError
from core.request import EngineRequest, TokenLogprob
from core.roles import WorkerRole
from decode_worker.rank import DecodeRank
from engine.engine import NoCapacityError, Reservation
from engine.output_channel import Item
from kv_transfer import Role
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
        self._arrivals: dict[str, concurrent.futures.Future[str | None]] = {}
        """request id -> resolves when every rank reported its RECV (None: all ok)."""
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

    async def reserve(self, request: EngineRequest, timeout_s: float, sender: str) -> Reservation:
        """Reserve blocks for the prompt and arm every rank's transport to receive its KV
        heads from prefill worker `sender`. Blocks this worker already caches for the prefix
        are reused: the sender skips them. The block ids are the same on every rank
        (lockstep schedulers)."""
        self._check_admitting()
        request_id = request.request_id

        def reserve(g: EngineGroup) -> Reservation:
            res = g.call_all("reserve", request, timeout_s, sender)
            self._arrivals[request_id] = self.tracker.add(request_id, Role.RECV)
            return res

        try:
            return await self.engine.call(reserve)
        except NoCapacityError as e:
            raise KVCapacityError(f"{self.worker_id}: {e}") from e

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
            self._forget(request.request_id)
            raise
