"""The decode worker actor (also the `unified` worker: same class, both phases).

Request paths it serves:
  disaggregated   reserve() -> [prefill worker writes KV] -> admit() streams deltas
  on this worker  generate() streams deltas (conditional disaggregation, unified mode)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import AsyncIterator
from typing import Any

from core.errors import KVCapacityError, WorkerFailedError
from core.request import EngineRequest, OutputDelta, TokenLogprob
from core.roles import WorkerRole
from decode_worker.rank import DecodeRank
from engine.engine import NoCapacityError, Reservation
from kv_transfer import Role
from worker.base import WorkerBase
from worker.group import EngineGroup
from worker.records import WorkerSpec

logger = logging.getLogger(__name__)


class DecodeWorker(WorkerBase):
    engine_role = WorkerRole.UNIFIED
    rank_class = DecodeRank

    def __init__(self, spec: WorkerSpec, placement: Any = None) -> None:
        super().__init__(spec, placement)
        self._arrivals: dict[str, concurrent.futures.Future[str | None]] = {}
        """request id -> resolves when every rank reported its RECV (None: all ok)."""

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
    ) -> AsyncIterator[OutputDelta]:
        """Wait until every rank received every layer of the prompt's KV, then join the
        running batch and stream deltas (the first carries the first token) until the
        request finishes."""
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
        self.engine.open_stream(request_id)
        try:
            out = await self.engine.call(
                lambda g: g.call_all("admit_transferred", request_id, first_token, logprob)
            )
        except KeyError as e:
            self.engine.close_stream(request_id)
            raise WorkerFailedError(str(e)) from e
        yield out
        if out.finished:
            self.engine.close_stream(request_id)
            return
        async for out in self.engine.stream(request_id, timeout_s):
            yield out

    async def abort(self, request_id: str) -> bool:
        self._arrivals.pop(request_id, None)
        return await super().abort(request_id)

    async def generate(
        self, request: EngineRequest, timeout_s: float
    ) -> AsyncIterator[OutputDelta]:
        """Prefill and decode here (unified mode; conditional disaggregation)."""
        self._check_admitting()
        self.engine.open_stream(request.request_id)
        try:
            await self.engine.call(lambda g: g.call_all("enqueue", request))
        except BaseException:
            self.engine.close_stream(request.request_id)
            raise
        async for out in self.engine.stream(request.request_id, timeout_s):
            yield out
