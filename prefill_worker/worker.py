"""The prefill worker actor.

`route()` connects every rank to where a decode worker takes its KV (the decode worker's
answer to this one's metadata: its matching rank, or, laid out otherwise, the landing areas
of the ranks that need this rank's heads: worker/landing.py). `prefill()` tells every rank
the prompt and its destination (decode worker, reserved block ids, blocks to skip); the
block ids may follow in `destination()`, so that the prompt computes while the decode worker
reserves them (the front door makes both calls at once: router/cluster/attempt.py). In the
step that completes the prompt, each rank's KV connector (prefill_worker/connector.py) sends
that rank's heads of each layer there the moment the model finishes the layer, so the
transfer overlaps the remaining layers. The first token goes back to the caller; the
blocks stay held until every rank's transfer finished (acknowledged or failed), then
return to this worker's prefix cache, on all ranks at once.

Prefix migration (the router's `PrefixPull`): this worker may also receive a prompt prefix
from a peer prefill worker that caches it, instead of computing it: `reserve()` (shared with
the decode worker), the peer's `prefill()` of the prefix sends its KV here, then
`import_prefix()` names the blocks in this worker's prefix cache for the prompt to hit.
The peer's copy, once sent, is the first its cache evicts (`hand_over`): the prefix moves
rather than doubles, unless a request of the peer's own hits it first (two copies of every
pulled prefix cost the pool the reuse of what they evicted).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import trace

from core.config import EngineConfig
from core.errors import DeadlineExceededError, WorkerFailedError
from core.request import EngineRequest, OutputDelta, TokenLogprob
from core.tracing import SpanName, ending
from kv_transfer import Role
from prefill_worker.connector import Destination, PrefillResult
from prefill_worker.rank import PrefillRank
from worker.base import WorkerBase
from worker.group import RankGroup, decode_routes
from worker.records import WorkerSpec
from worker.spans import kv_transfer_span, prefill_spans, served
from worker.tracker import Outcome

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefillReply:
    first_token: int
    logprob: TokenLogprob | None
    output: OutputDelta
    """The first token's delta; `finished` when it already ends the request."""
    num_cached_tokens: int
    """Prompt tokens this worker took from its own prefix cache."""
    num_blocks: int
    """The prompt's blocks here; those past the receiver's `skip_blocks` are sent."""
    backlog: tuple[int, int, int]
    """When this worker's load reports counted the request (PrefillResult.backlog)."""


@dataclass
class _Waiter:
    future: asyncio.Future[PrefillResult]
    loop: asyncio.AbstractEventLoop


class PrefillWorker(WorkerBase):
    rank_class = PrefillRank

    def __init__(self, spec: WorkerSpec, placement: Any = None) -> None:
        super().__init__(spec, placement)
        self.waiters: dict[str, _Waiter] = {}
        """request id -> the caller waiting for its first token."""
        self.hand_overs: set[str] = set()
        """Prefixes sent to a peer that pulls them: released as the first to evict."""
        self._traced_sends: dict[str, tuple[trace.Span, int]] = {}
        """Traced prompts whose KV is leaving: the prefill span and the blocks sent, for the
        kv_transfer span when every rank's transfer reported (engine thread)."""

    @classmethod
    def engine_config(cls, spec: WorkerSpec) -> EngineConfig:
        """A prefill worker's engine samples first tokens only: no speculation, no decode
        graphs (its prompt steps keep theirs)."""
        config = super().engine_config(spec)
        return replace(config, speculative=None, speculative_model=None, decode_graphs=False)

    async def prefill(
        self,
        request: EngineRequest,
        peer: str,
        dst_block_ids: list[int] | None,
        skip_blocks: int,
        timeout_s: float,
        hand_over: bool = False,
    ) -> PrefillReply:
        """`peer` is the receiving worker's id, `dst_block_ids` its blocks for this worker's
        blocks from `skip_blocks` on (its `KVReservation`); None: `destination()` names them
        (and the skip) while the prompt computes, within `timeout_s`. `hand_over`: the
        prompt is a prefix `peer`, a prefill worker, pulls (prefix migration): once sent,
        its blocks are the first this worker's cache evicts."""
        self._check_admitting()
        span = served(
            self.tracing, request.trace, SpanName.PREFILL, **{"baton.worker": self.worker_id}
        )
        with ending(span):
            reply = await self._prefill(
                request, peer, dst_block_ids, skip_blocks, timeout_s, hand_over, span
            )
            if span.is_recording():
                timings = reply.output.timings
                uncached = len(request.prompt_token_ids) - reply.num_cached_tokens
                chunks = -(-uncached // self.config.max_num_batched_tokens)
                prefill_spans(self.tracing, span, timings, max(1, chunks))
                span.set_attribute("baton.cached_tokens", reply.num_cached_tokens)
            return reply

    async def destination(
        self, request_id: str, dst_block_ids: list[int], skip_blocks: int
    ) -> None:
        """The receiving worker's blocks for a prompt whose `prefill` came without them: its
        layers go there once computed (at once, if they are). Nothing for a prompt this
        worker no longer has (aborted, or its wait ran out).

        With one rank (in this process) the blocks are named from here at once, not behind
        the engine's step: a prompt whose step is running sends the layers written so far
        now and each later one as it is written, as if the blocks had come with it. Ranks
        of their own take them between steps."""
        rank = getattr(self.group, "rank", None)
        if rank is not None:
            rank.set_destination(request_id, dst_block_ids, skip_blocks)

        def name(g: RankGroup) -> None:
            traced = self._traced_sends.get(request_id)
            if traced is not None:
                self._traced_sends[request_id] = (traced[0], len(dst_block_ids))
            if rank is None:
                g.all(PrefillRank.set_destination, request_id, dst_block_ids, skip_blocks)

        if rank is None:
            await self.engine.call(name)
        else:
            self.engine.submit(name)  # the trace's bookkeeping, on the engine thread

    async def _prefill(
        self,
        request: EngineRequest,
        peer: str,
        dst_block_ids: list[int] | None,
        skip_blocks: int,
        timeout_s: float,
        hand_over: bool,
        span: trace.Span,
    ) -> PrefillReply:
        request_id = request.request_id
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), loop)
        dst = None if dst_block_ids is None else list(dst_block_ids)
        dest = Destination(peer, dst, skip_blocks, timeout_s)

        def start(g: RankGroup) -> None:
            g.all(PrefillRank.add_prefill, request, dest)
            self.tracker.add(request_id, Role.SEND)
            if span.is_recording():  # blocks named before it started here are its own now
                named = dst_block_ids or g.first(PrefillRank.named_blocks, request_id)
                self._traced_sends[request_id] = (span, len(named or ()))

        self.waiters[request_id] = waiter
        if hand_over:
            self.hand_overs.add(request_id)
        try:
            await self.engine.call(start)
        except BaseException:
            self.waiters.pop(request_id, None)
            self.hand_overs.discard(request_id)
            raise
        try:
            result = await asyncio.wait_for(waiter.future, timeout_s)
        except TimeoutError as e:
            await self.abort(request_id)
            raise DeadlineExceededError(f"prefill of {request_id} exceeded {timeout_s} s") from e
        return PrefillReply(
            result.first_token,
            result.logprob,
            result.output,
            result.num_cached_tokens,
            len(result.block_ids),
            result.backlog,
        )

    async def route(self, routes: bytes) -> str:
        """Connect every rank to where a receiving worker takes its KV (the `Routes` its
        `accept` answered with). Returns the receiver's id."""
        answer = decode_routes(routes, self.spec.tp)
        await self.engine.call(
            lambda g: g.each(PrefillRank.kv_route, answer.worker_id, answer.ranks)
        )
        return answer.worker_id

    async def import_prefix(self, request_id: str, timeout_s: float) -> int:
        """Once a reserved prefix (`reserve`) has arrived from the peer, put its blocks in
        this worker's prefix cache on every rank. Returns the blocks now cached."""
        await self._kv_arrived(request_id, timeout_s)
        try:
            return await self.engine.call(lambda g: g.all(PrefillRank.import_prefix, request_id))
        except KeyError as e:  # aborted meanwhile
            raise WorkerFailedError(str(e)) from e

    def _after_step(self) -> None:
        """Engine thread: hand first tokens to waiting callers, then (base class) collect
        finished transfers, which release the blocks."""
        if self.waiters:
            for result in self.group.all(PrefillRank.take_prefilled):
                waiter = self.waiters.pop(result.request_id, None)
                if waiter is None:  # nobody waits: released when its transfer ends
                    continue
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future, result)
        super()._after_step()

    def _on_transfer_done(self, outcome: Outcome) -> None:
        super()._on_transfer_done(outcome)
        if outcome.role is Role.SEND:  # every rank is done with the source blocks
            request_id = outcome.request_id
            traced = self._traced_sends.pop(request_id, None)
            if traced is not None:
                self._trace_transfer(request_id, *traced, outcome.error)
            evict_first = request_id in self.hand_overs
            self.hand_overs.discard(request_id)
            self.group.all(PrefillRank.release, request_id, evict_first)

    def _trace_transfer(
        self, request_id: str, span: trace.Span, num_blocks: int, error: str | None
    ) -> None:
        """Engine thread: the prompt's kv_transfer span, from its layers' post times."""
        posted = self.group.first(PrefillRank.take_post_times, request_id)
        info = self._info
        layers = max(1, len(posted))
        per_layer = num_blocks * info.kv_bytes_per_block // layers
        kv_transfer_span(self.tracing, span, posted, per_layer, info.transport_backend, error)

    def _forget(self, request_id: str) -> None:
        self.waiters.pop(request_id, None)
        self.hand_overs.discard(request_id)
        super()._forget(request_id)


def _resolve(future: asyncio.Future, value: object) -> None:
    if not future.done():
        future.set_result(value)
