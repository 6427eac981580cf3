"""The prefill worker actor.

`prefill()` queues the prompt with its destination (decode worker, reserved block ids). In
the step that completes the prompt, the KV connector below sends each layer's blocks the
moment the model finishes that layer, so the transfer overlaps the remaining layers. The
first token goes back to the caller; the blocks stay held until every layer was
acknowledged (or the transfer failed), then return to this worker's prefix cache.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from core.errors import DeadlineExceededError, InvalidRequestError, OverloadedError
from core.request import RequestOutput, TokenLogprob
from core.sampling import SamplingParams
from decode_worker.base import WorkerBase
from engine.engine import LLMEngine, PrefillResult
from engine.kv_connector import LayerHook
from engine.request import Request

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefillReply:
    first_token: int
    logprob: TokenLogprob | None
    output: RequestOutput
    """`finished` when the first token already ends the request."""
    num_cached_tokens: int
    """Prompt tokens this worker took from its own prefix cache."""
    num_blocks_sent: int


@dataclass
class _Destination:
    peer: str
    dst_block_ids: list[int]
    skip_blocks: int
    timeout_s: float
    future: asyncio.Future[PrefillResult]
    loop: asyncio.AbstractEventLoop
    handles: list = None  # type: ignore[assignment]
    num_blocks_sent: int = 0


class TransportConnector:
    """engine.kv_connector.KVConnector over a kv_transfer.Transport (runs on the engine
    thread)."""

    def __init__(self, worker: PrefillWorker) -> None:
        self.worker = worker

    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        sends = []
        for req, block_ids in completing:
            dest = self.worker.destinations.get(req.request_id)
            if dest is None:
                continue
            if len(block_ids) != len(dest.dst_block_ids):
                logger.error("%s: %d source blocks for %d reserved", req.request_id,
                             len(block_ids), len(dest.dst_block_ids))
                continue
            src = block_ids[dest.skip_blocks :]
            dst = dest.dst_block_ids[dest.skip_blocks :]
            dest.handles = []
            dest.num_blocks_sent = len(src)
            sends.append((req.request_id, src, dest, dst))
        if not sends:
            return None
        transport = self.worker.transport

        def layer_done(layer: int) -> None:
            for rid, src, dest, dst in sends:
                dest.handles.append(
                    transport.send(rid, src, dest.peer, dst, [layer], dest.timeout_s)
                )

        return layer_done

    def end_step(self) -> None:
        pass


class PrefillWorker(WorkerBase):
    engine_role = "prefill"

    def __init__(self, spec) -> None:  # noqa: ANN001 - WorkerSpec
        super().__init__(spec)
        self.destinations: dict[str, _Destination] = {}
        self.llm.kv_connector = TransportConnector(self)
        self.engine.after_step.append(self._after_step)

    async def prefill(
        self,
        request_id: str,
        token_ids: list[int],
        params: SamplingParams,
        peer: str,
        dst_block_ids: list[int],
        skip_blocks: int,
        timeout_s: float,
    ) -> PrefillReply:
        if self.draining:
            raise OverloadedError(f"{self.worker_id} is draining")
        loop = asyncio.get_running_loop()
        dest = _Destination(peer, dst_block_ids, skip_blocks, timeout_s, loop.create_future(), loop)
        self.destinations[request_id] = dest
        try:
            await self.engine.call(lambda e: e.add_request(request_id, token_ids, params))
        except ValueError as e:
            self.destinations.pop(request_id, None)
            raise InvalidRequestError(str(e)) from e
        try:
            result = await asyncio.wait_for(dest.future, timeout_s)
        except TimeoutError as e:
            self.destinations.pop(request_id, None)
            await self.abort(request_id)
            raise DeadlineExceededError(f"prefill of {request_id} exceeded {timeout_s} s") from e
        self.account_prompt(len(token_ids), result.num_cached_tokens)
        return PrefillReply(
            result.first_token, result.logprob, result.output, result.num_cached_tokens,
            dest.num_blocks_sent,
        )

    def _after_step(self) -> None:
        """Engine thread: hand first tokens to waiting callers; free blocks whose every
        layer was acknowledged (or whose transfer failed)."""
        engine: LLMEngine = self.llm
        for result in engine.take_prefilled():
            dest = self.destinations.get(result.request_id)
            if dest is None:  # nobody waits (cancelled): nothing to send
                engine.release(result.request_id)
                continue
            dest.loop.call_soon_threadsafe(_resolve, dest.future, result)
        for rid, dest in list(self.destinations.items()):
            if dest.handles is None:
                continue
            if len(dest.handles) == engine.model_config.num_hidden_layers and all(
                h.done() for h in dest.handles
            ):
                engine.release(rid)
                del self.destinations[rid]
            elif any(h.done() and h.error for h in dest.handles):
                engine.release(rid)
                del self.destinations[rid]
        self.transport.poll()  # results are tracked through the handles

    async def abort(self, request_id: str) -> bool:
        self.destinations.pop(request_id, None)
        return await super().abort(request_id)


def _resolve(future: asyncio.Future, value: object) -> None:
    if not future.done():
        future.set_result(value)
