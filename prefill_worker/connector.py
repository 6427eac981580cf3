"""The prefill side of the handoff: the engine's KV connector on a prefill worker's rank
(engine/kv_connector.py). Sends each layer of this rank's heads to the decode worker's
reserved blocks the moment the model wrote it, so the transfer overlaps the remaining
layers, and parks each prompt after its first token until its KV was handed over.

    add(request, dest)       a prompt and where its KV goes (before the engine queues it)
    begin_step(completing)   the step that completes a prompt: plan its sends; the hook
                             posts every layer as it is written
    request_prefilled(...)   its first token: park it, keep a PrefillResult for the worker
    take_prefilled()         the worker collects them after the step
    take_post_times(id)      when each layer of a traced prompt was handed to the transport
    forget(request_id)       aborted: no send, no result
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.device_event import DeviceEvent
from core.request import EngineRequest, OutputDelta, TokenLogprob
from engine.engine import LLMEngine
from engine.kv_connector import LayerHook
from engine.request import Request
from kv_transfer import Role, TransferResult, Transport

logger = logging.getLogger(__name__)

PeerName = Callable[[str], str]
"""A decode worker's id -> the transport name of its rank that pairs with this one."""


@dataclass(frozen=True)
class Destination:
    """Where a prompt's KV goes: the decode worker and the blocks it reserved; the first
    `skip_blocks` it already holds and are not sent."""

    peer_worker_id: str
    dst_block_ids: list[int]
    skip_blocks: int
    timeout_s: float


@dataclass(frozen=True)
class PrefillResult:
    """A prompt's KV is in `block_ids` and its first token is sampled."""

    request_id: str
    first_token: int
    logprob: TokenLogprob | None
    block_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int
    output: OutputDelta
    """`finished` when the first token already ends the request (nothing left to decode;
    the blocks are still held until `release`)."""
    backlog: tuple[int, int, int]
    """(arrived, ended, tokens): a load report taken after n engine steps counted `tokens`
    of it in its prefill backlog iff arrived <= n < ended (its steps when it arrived and
    when its prefill ended), at most `tokens` once it had started. The router uses this to
    correct a report that reaches it after the prefill's reply (router.routing.load)."""


@dataclass
class _Send:
    """One request's per-layer sends within a step; `num_posted` < 0 once one failed."""

    request_id: str
    src_block_ids: list[int]
    peer: str
    dst_block_ids: list[int]
    timeout_s: float
    num_posted: int = 0


class PrefillConnector:
    """`engine.kv_connector.KVConnector` of one prefill rank: `peer_name` maps a decode
    worker's id to the transport name of its matching rank."""

    def __init__(self, engine: LLMEngine, transport: Transport, peer_name: PeerName) -> None:
        self.engine, self.transport, self.peer_name = engine, transport, peer_name
        self.destinations: dict[str, Destination] = {}
        """Prompts whose sends are not planned yet."""
        self._sending: set[str] = set()
        """Prompts parked after their first token."""
        self._prefilled: list[PrefillResult] = []
        self.unsent: list[TransferResult] = []
        """Results of sends that never started: the rank's next kv_poll reports them."""
        self.post_times: dict[str, list[int]] = {}
        """Traced prompts only: the epoch ns each layer was posted, for the trace's
        kv_transfer span (one int a layer; taken when the transfer ends)."""

    def add(self, request: EngineRequest, dest: Destination) -> None:
        request_id = request.request_id
        self.destinations[request_id] = dest
        self._sending.add(request_id)
        if request.trace.traceparent:
            self.post_times[request_id] = []
        try:
            self.engine.enqueue(request)
        except Exception:
            self.forget(request_id)
            raise

    def take_prefilled(self) -> list[PrefillResult]:
        results, self._prefilled = self._prefilled, []
        return results

    # -- scheduler side ------------------------------------------------------------------
    def request_prefilled(
        self, req: Request, first_token: int, logprob: TokenLogprob | None, delta: OutputDelta
    ) -> bool:
        if req.request_id not in self._sending:
            return False
        self._sending.discard(req.request_id)
        block_ids = self.engine.kv.block_ids(req.request_id)
        backlog = (req.arrival_step, self.engine.step_totals.steps, req.num_tokens - 1)
        self._prefilled.append(PrefillResult(
            req.request_id, first_token, logprob, block_ids, req.num_prompt_tokens,
            max(req.num_cached_tokens, 0), delta, backlog,
        ))  # fmt: skip
        return True

    def take_post_times(self, request_id: str) -> list[int]:
        return self.post_times.pop(request_id, [])

    def forget(self, request_id: str) -> None:
        self.destinations.pop(request_id, None)
        self._sending.discard(request_id)
        self.post_times.pop(request_id, None)

    # -- layer side ----------------------------------------------------------------------
    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        """Runs inside this rank's step, with the requests whose prompt KV the step
        completes: returns the hook that sends each layer the moment it is written."""
        sends = [s for req, block_ids in completing if (s := self._plan(req, block_ids))]
        if not sends:
            return None

        def layer_done(layer: int, written: DeviceEvent | None) -> None:
            for send in sends:
                if send.num_posted >= 0:  # not failed yet
                    self._send_layer(send, layer, written)

        return layer_done

    def end_step(self) -> None:
        pass

    def _plan(self, req: Request, block_ids: list[int]) -> _Send | None:
        dest = self.destinations.pop(req.request_id, None)
        if dest is None:
            return None
        peer = self.peer_name(dest.peer_worker_id)
        src, dst = block_ids[dest.skip_blocks :], dest.dst_block_ids[dest.skip_blocks :]
        if len(block_ids) != len(dest.dst_block_ids) or not src:
            error = f"{len(block_ids)} source blocks for {len(dest.dst_block_ids)} reserved"
            self.unsent.append(TransferResult(req.request_id, Role.SEND, False, peer, (), error))
            return None
        return _Send(req.request_id, src, peer, dst, dest.timeout_s)

    def _send_layer(self, send: _Send, layer: int, written: DeviceEvent | None) -> None:
        try:
            # Offered once `written` completed: on a GPU the layer's kernels may still be
            # queued when the hook fires.
            self.transport.send(
                send.request_id, send.src_block_ids, send.peer, send.dst_block_ids, [layer],
                send.timeout_s, written,
            )  # fmt: skip
            send.num_posted += 1
            posted = self.post_times.get(send.request_id)
            if posted is not None:
                posted.append(time.time_ns())
        except Exception as e:  # never fail the step (the other ranks go on)
            logger.warning("%s: sending layer %d failed: %s", send.request_id, layer, e)
            if send.num_posted == 0:
                result = TransferResult(send.request_id, Role.SEND, False, send.peer, (), str(e))
                self.unsent.append(result)
            else:  # posted layers: the transport reports the failure itself
                self.transport.cancel(send.request_id)
            send.num_posted = -1
