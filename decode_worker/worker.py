"""The decode worker actor (also the `unified` worker: same class, both phases).

Request paths it serves:
  disaggregated   reserve() -> [prefill worker writes KV] -> admit() streams tokens
  on this worker  generate() streams tokens (conditional disaggregation, unified mode)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from core.errors import InvalidRequestError, OverloadedError, WorkerFailedError
from core.request import RequestOutput, TokenLogprob
from core.sampling import SamplingParams
from decode_worker.base import WorkerBase
from engine.engine import NoCapacityError, Reservation

logger = logging.getLogger(__name__)


class DecodeWorker(WorkerBase):
    engine_role = "unified"

    async def reserve(
        self, request_id: str, token_ids: list[int], params: SamplingParams, timeout_s: float
    ) -> Reservation:
        """Reserve blocks for the prompt and arm the transport to receive its KV. Blocks this
        worker already caches for the prefix are reused: the sender skips them."""
        if self.draining:
            raise OverloadedError(f"{self.worker_id} is draining")
        try:
            res = await self.engine.call(lambda e: e.reserve(request_id, token_ids, params))
        except NoCapacityError as e:
            raise OverloadedError(str(e)) from e
        except ValueError as e:
            raise InvalidRequestError(str(e)) from e
        skip = res.num_cached_tokens // self.llm.config.block_size
        self.transport.expect(
            request_id, res.block_ids[skip:], self.llm.model_config.num_hidden_layers, timeout_s
        )
        self.account_prompt(len(token_ids), res.num_cached_tokens)
        return res

    async def admit(
        self,
        request_id: str,
        first_token: int,
        logprob: TokenLogprob | None,
        timeout_s: float,
    ) -> AsyncIterator[RequestOutput]:
        """Wait until every layer of the prompt's KV landed, then join the running batch and
        stream outputs (cumulative) until the request finishes."""
        from kv_transfer import Role

        try:
            result = await asyncio.to_thread(
                self.transport.wait, request_id, Role.RECV, timeout_s
            )
        except TimeoutError as e:
            await self.abort(request_id)
            raise WorkerFailedError(f"KV for {request_id} did not arrive within {timeout_s} s") from e
        if not result.ok:
            await self.abort(request_id)
            raise WorkerFailedError(f"KV transfer for {request_id} failed: {result.error}")
        self.engine.open_stream(request_id)
        try:
            out = await self.engine.call(
                lambda e: e.admit_transferred(request_id, first_token, logprob)
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

    async def generate(
        self, request_id: str, token_ids: list[int], params: SamplingParams, timeout_s: float
    ) -> AsyncIterator[RequestOutput]:
        """Prefill and decode here (unified mode; conditional disaggregation)."""
        if self.draining:
            raise OverloadedError(f"{self.worker_id} is draining")
        self.engine.open_stream(request_id)
        try:
            await self.engine.call(lambda e: e.add_request(request_id, token_ids, params))
        except ValueError as e:
            self.engine.close_stream(request_id)
            raise InvalidRequestError(str(e)) from e
        first = True
        async for out in self.engine.stream(request_id, timeout_s):
            if first:
                self.account_prompt(len(token_ids), out.num_cached_tokens)
                first = False
            yield out
