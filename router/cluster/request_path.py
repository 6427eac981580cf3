"""The request path across the pools: the cluster's `Backend`.

For each request (docs/architecture.md, "One request, disaggregated"):

  0. the prompt is checked (the one check on its way in) and its full blocks hashed, once:
     the hashes go to the router and, with the request, to the workers' prefix caches
  1. the router picks a decode worker D and, unless D prefills it itself, a prefill worker
     P, and hands back the request's ticket; the request waits its turn at P's gate (with
     late binding it is routed only once some prefill worker has room: prefill_gate.py)
  1b. when the router chose to migrate a prefix (`PrefixPull`: a busy peer prefill worker
     Q caches more of the prompt than P), P copies those blocks from Q's cache first and
     computes only the rest (prefix_pull.py)
  2. D reserves blocks (reusing its cached prefix) and arms its transport    -> block ids
  3. P prefills (reusing its own cached prefix), sending each layer's KV into D's blocks
     as soon as the layer is done                                             -> first token
  4. D waits for every layer, admits the request and streams deltas back, over the one
     output channel this front door keeps with D (worker_channel.py)

Every await has a deadline. If a worker dies mid-request, the request is retried on
another one with what the client has been sent (`core.resume.ResumeState`): it prefills
prompt + those tokens and continues the stream exactly as if nothing had failed (the same
text, stops, penalties and seeded draws), without repeating or skipping a token; after
`max_retries` it fails with a clear error.
A client that goes away cancels the request on both workers (blocks freed). The ticket is
closed however an attempt ends, so the router's ledger and the gate never leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from core.errors import (
    BatonError,
    DeadlineExceededError,
    KVCapacityError,
    OverloadedError,
    WorkerFailedError,
)
from core.hashing import BlockHash
from core.request import EngineRequest, OutputDelta, check_prompt
from core.resume import ResumeState
from core.roles import WorkerRole
from router.cluster.autoscale.signals import WaitBook
from router.cluster.membership import Membership
from router.cluster.prefill_gate import PrefillGate
from router.cluster.prefix_pull import pull_prefix
from router.cluster.transfer_stats import TransferStats
from router.cluster.worker_channel import Queue, WorkerChannel
from router.frontdoor.backend import GenerateRequest
from router.frontdoor.metrics import Metrics
from router.routing.route import NoWorkerError, Router
from router.routing.ticket import Ticket

logger = logging.getLogger(__name__)

_ACTOR_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)
_MIN_WAIT_S = 0.1
"""The shortest deadline handed to a call: a request that is nearly out of time still gets
a clean answer rather than a timeout of zero."""


def _retryable(e: BaseException) -> bool:
    """The worker, not the request, failed: the actor is gone, a worker said so, or a worker
    raised something that is not one of our request errors (a broken engine)."""
    if isinstance(e, (*_ACTOR_GONE, WorkerFailedError)):
        return True
    return isinstance(e, RayTaskError) and not isinstance(e, BatonError)


class RequestPath:
    def __init__(
        self,
        membership: Membership,
        router: Router,
        tokenizer: Any,
        model_name: str,
        prefill_queue_tokens: int = 4096,
        max_retries: int = 2,
        max_kv_wait_s: float = 30.0,
    ) -> None:
        """`prefill_queue_tokens`: uncached prompt tokens admitted to one prefill worker at a
        time (router.cluster.prefill_gate); about two engine steps' token budget.
        `max_kv_wait_s`: how long a request waits for a decode worker's KV blocks to free
        up before 429."""
        self.membership = membership
        self.router = router
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.gate = PrefillGate(router, prefill_queue_tokens)
        membership.on_left.append(self.gate.drop_worker)
        self._channels: dict[str, WorkerChannel] = {}
        membership.on_left.append(self._drop_channel)
        self.max_retries = max_retries
        self.max_kv_wait_s = max_kv_wait_s
        self.transfers = TransferStats()
        self.waits = {WorkerRole.PREFILL: WaitBook(), WorkerRole.DECODE: WaitBook()}
        """Requests queued at this door for a pool (reported to the autoscaler)."""
        self.metrics: Metrics | None = None
        """Set when front doors export metrics (routing decisions, KV transfers)."""

    @property
    def max_model_len(self) -> int:
        model = self.membership.model
        return model.max_model_len if model is not None else 0

    def is_ready(self) -> bool:
        return self.membership.is_ready()

    def channel(self, worker: Any) -> WorkerChannel:
        """This front door's output channel with decode worker `worker` (a new one when the
        last one broke)."""
        ch = self._channels.get(worker.worker_id)
        if ch is None or ch.error is not None:
            ch = WorkerChannel(worker.worker_id, worker.handle, self.membership)
            self._channels[worker.worker_id] = ch
        return ch

    def _drop_channel(self, worker_id: str) -> None:
        ch = self._channels.pop(worker_id, None)
        if ch is not None:
            ch.stop()

    # -- one request, retried across workers -------------------------------------------------
    async def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.timeout_s
        self.membership.wake()
        if not self.membership.workers:
            await self.membership.sync()
        model = self.membership.model
        if model is None:
            raise OverloadedError("no worker has joined the cluster yet", 2.0)
        check_prompt(request.prompt_token_ids, model.max_model_len, model.vocab_size)
        params = request.params
        prompt = list(request.prompt_token_ids)
        hashes: list[BlockHash] = []
        done_tokens: list[int] = []
        done_text: list[str] = []
        """What the client has already been sent: a retry continues after it."""
        attempt = 0
        while True:
            attempt += 1
            rid = request.request_id if attempt == 1 else f"{request.request_id}.retry{attempt - 1}"
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise DeadlineExceededError(f"request {request.request_id} passed its deadline")
            hashes = self.router.hash_blocks(model.model_id, prompt + done_tokens, hashes)
            resume = ResumeState(tuple(done_tokens), "".join(done_text))
            sub = EngineRequest(rid, prompt, params, tuple(hashes), resume)
            try:
                async for delta in self._attempt(sub, remaining):
                    done_tokens += delta.new_token_ids
                    done_text.append(delta.new_text)
                    delta.request_id = request.request_id
                    yield delta
                return
            except OverloadedError:
                if attempt == 1:
                    raise
                # A retry found no live worker for a pool: the controller is replacing it.
                # Wait for it within the deadline rather than fail a half-served request.
                attempt -= 1
                await asyncio.sleep(0.5)
                await self.membership.sync()
            except TimeoutError as e:
                raise DeadlineExceededError(
                    f"request {request.request_id} passed its deadline of {request.timeout_s} s"
                ) from e
            except Exception as e:
                if not _retryable(e):
                    raise
                if attempt > self.max_retries:
                    raise WorkerFailedError(
                        f"request {request.request_id} failed after {attempt} attempts: {e}"
                    ) from e
                logger.warning(
                    "request %s: worker failed (%s); retrying with %d tokens done",
                    request.request_id,
                    type(e).__name__,
                    len(done_tokens),
                )
                await self.membership.sync()

    def _route(self, request: EngineRequest) -> Ticket:
        model = self.membership.model
        assert model is not None
        try:
            ticket = self.router.route(
                model.model_id,
                block_hashes=request.block_hashes,
                num_prompt_tokens=len(request.prompt_token_ids) + request.resume.num_output_tokens,
                num_output_tokens=request.params.max_tokens - request.resume.num_output_tokens,
                request_id=request.request_id,
            )
        except NoWorkerError as e:
            raise OverloadedError(f"no worker can take the request now: {e}", 2.0) from e
        return ticket

    # -- one attempt: route -> queue -> reserve -> prefill -> admit -> stream ------------------
    async def _attempt(
        self, request: EngineRequest, timeout_s: float
    ) -> AsyncIterator[OutputDelta]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        model = self.membership.model
        assert model is not None
        wait = self.router.config.late_binding and not self.gate.has_room(model.model_id)
        ticket = self._route(request)
        if wait and ticket.decision.prefill_worker_id is not None:
            # Late binding: no prefill worker can take it now, so it is routed again when one
            # can. (Routing first tells whether its decode worker would prefill it, which
            # needs no room; the tentative decision is withdrawn.)
            ticket.close()
            with self.waits[WorkerRole.PREFILL].waiting():
                ticket = await self.gate.bind(
                    model.model_id, lambda: self._route(request), timeout_s
                )
        if self.metrics is not None:
            self.metrics.record_router_decision(self.router.config.prefill_policy)
        with ticket:
            decision = ticket.decision
            workers = self.membership.workers
            decode = workers.get(decision.decode_worker_id)
            prefill = (
                workers.get(decision.prefill_worker_id) if decision.prefill_worker_id else None
            )
            if decode is None or (decision.prefill_worker_id and prefill is None):
                raise WorkerFailedError("the routed worker just left the cluster")
            attempt = _Attempt(self, request, decode, prefill, deadline)
            try:
                async for delta in attempt.run(ticket):
                    yield delta
            except Exception as e:
                if _retryable(e) and not isinstance(e, WorkerFailedError):
                    self.membership.suspect(attempt.calling.worker_id)  # dead or broken
                raise
            finally:
                if not attempt.finished:  # cancelled, failed or timed out
                    attempt.cancel()


@dataclass
class _Attempt:
    """One try of one request on one (prefill, decode) pair."""

    path: RequestPath
    request: EngineRequest
    decode: Any
    prefill: Any
    deadline: float
    calling: Any = None
    """The worker whose call is in flight: the one to blame if it dies."""
    queue: Queue | None = None
    """Where this attempt's deltas land, from the decode worker's output channel."""
    finished: bool = False

    def __post_init__(self) -> None:
        self.calling = self.decode

    def _left(self) -> float:
        return max(_MIN_WAIT_S, self.deadline - asyncio.get_running_loop().time())

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
                await asyncio.wait_for(
                    decode.handle.generate.remote(self.request, self._left(), channel.channel_id),
                    self._left(),
                )
                first = True
                async for delta in self._stream():
                    if first:  # it says what the decode worker's prefill reused
                        first = False
                        reused(decode.worker_id, delta.num_cached_tokens)
                    yield delta
                return
            with self.path.waits[WorkerRole.PREFILL].waiting():
                await self.path.gate.admit(ticket, self._left(), self.request.block_hashes)
            if ticket.decision.pull_from is not None:
                await pull_prefix(self.path, self.request, prefill, ticket.decision, self._left)
            reservation = await self._reserve()
            reused(decode.worker_id, reservation.num_cached_tokens)
            skip = reservation.num_cached_tokens // decode.info.block_size
            self.calling = prefill
            reply = await asyncio.wait_for(
                prefill.handle.prefill.remote(
                    self.request, decode.worker_id, reservation.block_ids, skip, self._left()
                ),
                self._left(),
            )
            ticket.prefill_done(reply.backlog)
            reused(prefill.worker_id, reply.num_cached_tokens)
            self.calling = decode
            first_token_at = asyncio.get_running_loop().time()
            stats.num_transfers += 1
            stats.num_blocks_sent += reply.num_blocks_sent
            stats.num_blocks_skipped += skip
            if reply.output.finished:
                decode.handle.abort.remote(rid)
                self.finished = True
                yield reply.output
                return
            admit = decode.handle.admit.remote(
                rid, reply.first_token, reply.logprob, self._left(), channel.channel_id
            )
            try:
                await asyncio.wait_for(admit, self._left())
            except Exception:  # the KV did not land (failed, timed out, D lost)
                if self.path.metrics is not None:
                    self.path.metrics.record_kv_transfer_failure()
                raise
            first = True
            async for delta in self._stream():
                if first:  # it comes once every layer has landed: what the transfer added
                    first = False
                    self._record_transfer(reply.num_blocks_sent, first_token_at)
                    delta.prompt_logprobs = reply.output.prompt_logprobs  # ran on P
                yield delta
        finally:
            channel.close(rid)

    async def _stream(self) -> AsyncIterator[OutputDelta]:
        assert self.queue is not None
        while True:
            async with asyncio.timeout(self._left()):  # not wait_for: see AsyncEngine.stream
                item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            self.finished = item.finished
            yield item
            if self.finished:
                return

    def _record_transfer(self, num_blocks_sent: int, first_token_at: float) -> None:
        waited = asyncio.get_running_loop().time() - first_token_at
        self.path.transfers.wait_s += waited
        metrics = self.path.metrics
        if metrics is not None:
            metrics.record_kv_transfer(
                num_blocks_sent * self.prefill.info.kv_bytes_per_block, waited
            )

    async def _reserve(self) -> Any:
        """Reserve the prompt's blocks on D. While D's KV is full, wait for its running
        requests to free blocks (bounded by the deadline and `max_kv_wait_s`) rather than
        refuse at once: a burst is queued, as a single engine would queue it."""
        loop = asyncio.get_running_loop()
        give_up = min(self.deadline, loop.time() + self.path.max_kv_wait_s)
        delay, queued_since_refusal = 0.02, False
        with contextlib.ExitStack() as queued:
            while True:
                timeout = self._left()
                try:
                    return await asyncio.wait_for(
                        self.decode.handle.reserve.remote(
                            self.request, timeout, self.prefill.worker_id
                        ),
                        timeout,
                    )
                except KVCapacityError:
                    if loop.time() + delay >= give_up:
                        raise
                if not queued_since_refusal:  # it waits for the decode pool from here on
                    queued.enter_context(self.path.waits[WorkerRole.DECODE].waiting())
                    queued_since_refusal = True
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.5)

    def cancel(self) -> None:
        """Free the request's blocks on both workers (fire and forget: they may be gone)."""
        for m in (self.decode, self.prefill):
            if m is not None:
                with contextlib.suppress(Exception):
                    m.handle.abort.remote(self.request.request_id)
