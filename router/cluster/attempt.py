"""One try of one request on one (prefill, decode) pair: gate -> reserve and prefill at once ->
admit -> stream (router/cluster/request_path.py routes it and retries it), with its spans. The
first token, sampled where the prompt was computed, goes to the client with the prefill's
reply; the decode worker's stream carries the rest.

Each step that waits on a worker is a client span under the attempt's span, and the worker's
own spans are children of it (the call carries its traceparent: core/tracing.py). The stream
adds a `first_token` span (from the prefill's reply to the first delta here: the KV's last
layers, admission, the first step) and one `decode` span per `DECODE_SPAN_TOKENS` tokens, at
most `MAX_DECODE_SPANS` (request_spans.DecodeSpans). When the attempt's span records
nothing, none of this runs: no span, no count per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import trace

from core.errors import KVCapacityError, WorkerFailedError
from core.request import EngineRequest, OutputDelta
from core.roles import WorkerRole
from core.tracing import SpanName, carry, ending
from router.cluster.prefix_pull import pull_prefix
from router.cluster.request_spans import DecodeSpans, prefill_attributes
from router.cluster.worker_channel import Queue
from router.routing.ticket import Ticket

_MIN_WAIT_S = 0.1
"""The shortest deadline handed to a call: a request that is nearly out of time still gets
a clean answer rather than a timeout of zero."""


@dataclass
class Attempt:
    path: Any
    """The RequestPath it belongs to."""
    request: EngineRequest
    decode: Any
    prefill: Any
    deadline: float
    span: trace.Span = trace.INVALID_SPAN
    """The attempt's span; its children are this attempt's steps."""
    calling: Any = None
    """The worker whose call is in flight: the one to blame if it dies."""
    queue: Queue | None = None
    """Where this attempt's deltas land, from the decode worker's output channel."""
    naming: asyncio.Future[Any] | None = None
    """P's answer to `destination` (D's blocks for the prompt), awaited with admission."""
    finished: bool = False

    def __post_init__(self) -> None:
        self.calling = self.decode
        self.tracer = self.path.tracing.tracer
        self.traced = self.span.is_recording()
        self.carries = self.traced and self.path.tracing.exporting
        """The workers are sent the trace context only when they export spans too (when
        only the door keeps its spans, a worker would parse it for nothing)."""

    def _left(self) -> float:
        return max(_MIN_WAIT_S, self.deadline - asyncio.get_running_loop().time())

    @contextlib.contextmanager
    def _step(self, name: str, **attributes: Any) -> Iterator[trace.Span]:
        """A client span for one step of the attempt (nothing when it is not traced)."""
        if not self.traced:
            yield trace.INVALID_SPAN
            return
        span = self.tracer.start_span(
            name,
            context=trace.set_span_in_context(self.span),
            kind=trace.SpanKind.CLIENT,
            attributes=attributes,
        )
        with ending(span):
            yield span

    def _carried(self, span: trace.Span) -> EngineRequest:
        """The request as sent under `span`: its worker spans are that span's children."""
        return replace(self.request, trace=carry(span)) if self.carries else self.request

    async def run(self, ticket: Ticket) -> AsyncIterator[OutputDelta]:
        rid, decode, prefill, stats = (
            self.request.request_id,
            self.decode,
            self.prefill,
            self.path.transfers,
        )
        reused = functools.partial(self.path.router.observe_reuse, ticket.decision)
        channel = self.path.channel(decode)
        self.queue = channel.open(rid)
        try:
            if prefill is None:
                stats.prefill_on_decode += 1
                with self._step(SpanName.PREFILL, **{"baton.worker": decode.worker_id}) as s:
                    await asyncio.wait_for(
                        decode.handle.generate.remote(
                            self._carried(s), self._left(), channel.channel_id
                        ),
                        self._left(),
                    )
                first = True
                async for delta in self._stream(asyncio.get_running_loop().time()):
                    if first:  # it says what the decode worker's prefill reused
                        first = False
                        reused(decode.worker_id, delta.num_cached_tokens)
                    yield delta
                return
            with self._step(SpanName.GATE_WAIT), self.path.waits[WorkerRole.PREFILL].waiting():
                await self.path.gate.admit(ticket, self._left(), self.request.block_hashes,
                                           self.request.priority, self.request.tenant)  # fmt: skip
            if ticket.decision.pull_from is not None:
                await pull_prefix(self.path, self.request, prefill, ticket.decision, self._left)
            reservation, reply = await self._reserve_and_prefill()
            reused(decode.worker_id, reservation.num_cached_tokens)
            skip = reservation.skip_blocks  # of the prefill worker's blocks
            num_sent = max(0, reply.num_blocks - skip)
            ticket.prefill_done(reply.backlog)
            reused(prefill.worker_id, reply.num_cached_tokens)
            self.calling = decode
            first_token_at = asyncio.get_running_loop().time()
            first_delta = replace(reply.output, prefilled_by=WorkerRole.PREFILL.value)
            stats.num_transfers += 1
            stats.num_blocks_sent += num_sent
            stats.num_blocks_skipped += skip
            if reply.output.finished:
                decode.handle.abort.remote(rid)
                self._drop_naming()
                self.finished = True
                yield first_delta
                return
            # The first token was sampled on P: the client has it now, not after the last
            # layers land on D and D admits it (D's first delta repeats it: not sent again).
            yield first_delta
            with self._step(SpanName.ADMIT, **{"baton.worker": decode.worker_id}) as s:
                admit = decode.handle.admit.remote(
                    rid, reply.first_token, reply.logprob, self._left(), channel.channel_id,
                    carry(s) if self.carries else None,
                )  # fmt: skip
                try:
                    await self._admitted(admit)
                except Exception:  # the KV did not land (failed, timed out, D or P lost)
                    if self.path.metrics is not None:
                        self.path.metrics.record_kv_transfer_failure()
                    raise
            first = True
            async for delta in self._stream(first_token_at):
                if first:  # it comes once every layer has landed: what the transfer added
                    first = False
                    self._record_transfer(num_sent, first_token_at)
                    if delta.new_token_ids == reply.output.new_token_ids and not delta.finished:
                        continue
                    delta = _after_first(delta, reply.output)
                yield delta
        finally:
            channel.close(rid)

    async def _stream(self, since: float) -> AsyncIterator[OutputDelta]:
        """The attempt's deltas from the channel; traced: a `first_token` span from `since`
        (loop time) to the first delta, then `decode` spans of DECODE_SPAN_TOKENS tokens."""
        assert self.queue is not None
        spans = DecodeSpans(self, since) if self.traced else None
        try:
            while True:
                async with asyncio.timeout(self._left()):  # not wait_for: see AsyncEngine.stream
                    item = await self.queue.get()
                if isinstance(item, BaseException):
                    raise item
                self.finished = item.finished
                if spans is not None:
                    spans.add(len(item.new_token_ids))
                yield item
                if self.finished:
                    return
        finally:
            if spans is not None:
                spans.end()

    def _record_transfer(self, num_blocks_sent: int, first_token_at: float) -> None:
        waited = asyncio.get_running_loop().time() - first_token_at
        self.path.transfers.wait_s += waited
        metrics = self.path.metrics
        if metrics is not None:
            metrics.record_kv_transfer(
                num_blocks_sent * self.prefill.info.kv_bytes_per_block, waited
            )

    async def _reserve_and_prefill(self) -> tuple[Any, Any]:
        """D reserves the prompt's blocks while P computes it: P is called without them and
        told them (`destination`) the moment D answers, so the first token waits for the
        longer of the two rather than their sum (P's layers wait for the blocks if it gets
        there first). While D's KV is full and requests wait for it in turn, P is called only
        once D has reserved, as it would otherwise hold a computed prompt's blocks through
        the wait. Returns (D's reservation, P's reply); the first to fail ends both (the
        caller's `cancel` frees what either holds)."""
        decode, prefill, rid = self.decode, self.prefill, self.request.request_id
        if self.path.decode_line.busy(decode.worker_id):
            reservation = await self._reserve()
            self.calling = prefill
            with self._step(SpanName.PREFILL, **{"baton.worker": prefill.worker_id}) as s:
                reply = await asyncio.wait_for(
                    prefill.handle.prefill.remote(
                        self._carried(s), decode.worker_id, reservation.dst_block_ids,
                        reservation.skip_blocks, self._left(),
                    ),
                    self._left(),
                )  # fmt: skip
                prefill_attributes(s, reply, reservation, prefill)
            return reservation, reply
        computing: asyncio.Future[Any] | None = None
        reserving: asyncio.Future[Any] | None = None
        try:
            with self._step(SpanName.PREFILL, **{"baton.worker": prefill.worker_id}) as s:
                call = prefill.handle.prefill.remote(  # the longer call: it goes out first
                    self._carried(s), decode.worker_id, None, 0, self._left()
                )
                computing = asyncio.ensure_future(asyncio.wait_for(call, self._left()))
                reserving = asyncio.ensure_future(self._reserve())
                await asyncio.wait({computing, reserving}, return_when=asyncio.FIRST_EXCEPTION)
                if computing.done() and computing.exception() is not None:
                    self.calling = prefill
                    computing.result()  # raises
                reservation = await reserving  # raises D's failure
                self.calling = prefill
                named = prefill.handle.destination.remote(
                    rid, reservation.dst_block_ids, reservation.skip_blocks
                )
                # Its answer waits for P's step to end: the first token does not wait for it.
                self.naming = asyncio.ensure_future(asyncio.wait_for(named, self._left()))
                reply = await computing
                prefill_attributes(s, reply, reservation, prefill)
        finally:
            _settle(computing, reserving)
        return reservation, reply

    async def _admitted(self, admit: Any) -> None:
        """D's admission (it waits for the KV) beside P's answer to `destination`: were P
        lost before it took D's blocks, nothing would send the KV, and the attempt fails
        now rather than at D's deadline."""
        admitting = asyncio.ensure_future(asyncio.wait_for(admit, self._left()))
        naming, self.naming = self.naming, None
        try:
            if naming is not None:
                await asyncio.wait({admitting, naming}, return_when=asyncio.FIRST_EXCEPTION)
                if naming.done() and naming.exception() is not None:
                    self.calling = self.prefill
                    naming.result()  # raises
            await admitting
            if naming is not None:
                self.calling = self.prefill
                await naming
                self.calling = self.decode
        finally:
            _settle(admitting, naming)

    def _drop_naming(self) -> None:
        """Nothing waits for P's answer to `destination` any more (P may be gone)."""
        if self.naming is not None:
            self.naming.add_done_callback(_retrieved)
            self.naming.cancel()
            self.naming = None

    async def _reserve(self) -> Any:
        """Reserve the prompt's blocks on D. While D's KV is full, wait for its running
        requests to free blocks (bounded by the deadline and `max_kv_wait_s`) rather than
        refuse at once: a burst is queued, as a single engine would queue it, in the fair
        share's order (router/cluster/decode_line.py)."""
        loop = asyncio.get_running_loop()
        give_up = min(self.deadline, loop.time() + self.path.max_kv_wait_s)
        line, worker = self.path.decode_line, self.decode.worker_id
        delay, waiting = 0.02, None
        with (
            self._step(SpanName.RESERVE, **{"baton.worker": worker}) as span,
            contextlib.ExitStack() as queued,
        ):
            request = self._carried(span)

            def join() -> Any:  # it waits for the decode pool from here on
                queued.enter_context(self.path.waits[WorkerRole.DECODE].waiting())
                span.add_event("decode pool full: waiting for blocks")
                joined = line.join(worker, request.priority, request.tenant)
                queued.callback(line.leave, joined)
                return joined

            if line.busy(worker):
                waiting = join()
            while True:
                if waiting is not None:
                    try:
                        await line.wait_turn(waiting, max(0.0, give_up - loop.time()))
                    except TimeoutError:
                        raise KVCapacityError(f"{worker}: no KV blocks freed in time") from None
                timeout = self._left()
                try:
                    reservation = await asyncio.wait_for(
                        self.decode.handle.reserve.remote(request, timeout, self.prefill.worker_id),
                        timeout,
                    )
                    span.set_attributes({
                        "baton.cached_tokens": reservation.num_cached_tokens,
                        "baton.blocks": reservation.num_blocks,
                    })  # fmt: skip
                    return reservation
                except KVCapacityError:
                    if loop.time() + delay >= give_up:
                        raise
                if waiting is None:
                    waiting = join()
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.5)

    def cancel(self) -> None:
        """Free the request's blocks on both workers (fire and forget: they may be gone)."""
        self._drop_naming()
        for m in (self.decode, self.prefill):
            if m is not None:
                with contextlib.suppress(Exception):
                    m.handle.abort.remote(self.request.request_id)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _settle(*tasks: asyncio.Future[Any] | None) -> None:
    """Calls awaited together, one of which may have failed: cancel those still running and
    retrieve the others' errors (the failure raised is the one that counts)."""
    for task in tasks:
        if task is None:
            continue
        if not task.done():
            task.cancel()
        else:
            _retrieved(task)


def _after_first(delta: OutputDelta, first: OutputDelta) -> OutputDelta:
    """D's first delta less the first token P's delta carried already: both engines processed
    that token from the same state, so it leads D's delta, text and logprobs alike."""
    n = len(first.new_token_ids)
    if delta.new_token_ids[:n] != first.new_token_ids or not delta.new_text.startswith(
        first.new_text
    ):
        raise WorkerFailedError(
            f"the decode worker's first output {delta.new_token_ids[:n]} is not the prefill "
            f"worker's {first.new_token_ids}"
        )
    logprobs = None if delta.new_logprobs is None else delta.new_logprobs[n:]
    return replace(
        delta,
        new_token_ids=delta.new_token_ids[n:],
        new_text=delta.new_text[len(first.new_text) :],
        new_logprobs=logprobs,
        prompt_logprobs=None,
    )
