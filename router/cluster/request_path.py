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
  3. at the same time P prefills (reusing its own cached prefix); told D's blocks as soon
     as D answers, it sends each layer's KV into them as soon as the layer is done (the
     layers computed before then wait for them)                              -> first token
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
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from core.errors import (
    BatonError,
    DeadlineExceededError,
    DrainingError,
    OverloadedError,
    WorkerFailedError,
)
from core.fair_share import FairShare, FairShareConfig
from core.hashing import BlockHash
from core.request import EngineRequest, OutputDelta, check_prompt
from core.resume import ResumeState
from core.roles import WorkerRole
from core.tracing import SpanName, Tracing, ending
from router.cluster.attempt import Attempt
from router.cluster.autoscale.signals import WaitBook
from router.cluster.decode_line import DecodeLine
from router.cluster.membership import Membership
from router.cluster.prefill_gate import PrefillGate
from router.cluster.request_spans import attempt_attributes, finish_span, route_attributes
from router.cluster.worker_channel import WorkerChannel
from router.frontdoor import door_trace
from router.frontdoor.backend import GenerateRequest
from router.frontdoor.metrics import Metrics
from router.frontdoor.slow_requests import SlowRequests
from router.routing.route import NoWorkerError, Router
from router.routing.ticket import Ticket

logger = logging.getLogger(__name__)

_ACTOR_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)


def _retryable(e: BaseException) -> bool:
    """The worker, not the request, failed: the actor is gone, a worker said so, or a worker
    raised something that is not one of our request errors (a broken engine)."""
    if isinstance(e, (*_ACTOR_GONE, WorkerFailedError)):
        return True
    return isinstance(e, RayTaskError) and not isinstance(e, BatonError)


@dataclass
class TransferStats:
    num_transfers: int = 0
    num_blocks_sent: int = 0
    num_blocks_skipped: int = 0
    """Prompt blocks the decode worker already held (multi-turn reuse): never sent."""
    prefill_on_decode: int = 0
    wait_s: float = 0.0
    """Total time decode workers waited for KV after the prefill's first token."""
    prefix_pulls: int = 0
    """Prefixes copied between prefill workers (router's PrefixPull) that arrived."""
    prefix_blocks_pulled: int = 0
    """Their blocks: reused by transfer, neither computed nor in P's own cache."""
    prefix_pulls_failed: int = 0


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
        tracing: Tracing | None = None,
        fair_share: FairShareConfig | None = None,
    ) -> None:
        """`prefill_queue_tokens`: uncached prompt tokens admitted to one prefill worker at a
        time (router.cluster.prefill_gate); about two engine steps' token budget.
        `max_kv_wait_s`: how long a request waits for a decode worker's KV blocks to free
        up before 429."""
        self.membership = membership
        self.router = router
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.fair = FairShare(fair_share)
        """Each tenant's served tokens: the gate's order; charged with the prompt tokens it
        admits and the output tokens streamed here."""
        self.gate = PrefillGate(router, prefill_queue_tokens, self.fair)
        self.decode_line = DecodeLine(self.fair)
        """Requests waiting for a decode worker's KV blocks, in the fair share's order."""
        membership.on_left.append(self.gate.drop_worker)
        membership.on_draining.append(self.gate.drop_worker)
        self._channels: dict[str, WorkerChannel] = {}
        membership.on_left.append(self._drop_channel)
        self.max_retries = max_retries
        self.max_kv_wait_s = max_kv_wait_s
        self.transfers = TransferStats()
        self.waits = {WorkerRole.PREFILL: WaitBook(), WorkerRole.DECODE: WaitBook()}
        """Requests queued at this door for a pool (reported to the autoscaler)."""
        self.tracing = tracing or Tracing()
        """This process's tracer (off: no span is made); the door shares it."""
        self.slow_requests: SlowRequests | None = None
        """The door's slowest recent requests, kept from this tracer's spans (bringup.py)."""
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
        door = door_trace.current()
        if door is not None:
            door.record.request_id = request.request_id
            door.record.tenant = request.tenant or door.record.tenant
            door.record.prompt_tokens += len(prompt)
        parent = trace.set_span_in_context(trace.get_current_span())  # the door's root
        retry_reason = ""
        attempt = reroutes = 0
        while True:
            attempt += 1
            tries = attempt - 1 + reroutes
            rid = request.request_id if tries == 0 else f"{request.request_id}.retry{tries}"
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise DeadlineExceededError(f"request {request.request_id} passed its deadline")
            extra = b"" if request.lora is None else request.lora.hash_extra
            hashes = self.router.hash_blocks(model.model_id, prompt + done_tokens, hashes, extra)
            resume = ResumeState(tuple(done_tokens), "".join(done_text))
            sub = EngineRequest(
                rid, prompt, params, tuple(hashes), model.block_size, resume,
                priority=request.priority, tenant=request.tenant, lora=request.lora,
            )  # fmt: skip
            span = self.tracing.tracer.start_span(SpanName.ATTEMPT, context=parent)
            if span.is_recording():
                span.set_attributes(attempt_attributes(sub, attempt, retry_reason))
            try:
                with ending(span):
                    async for delta in self._attempt(sub, remaining, span):
                        done_tokens += delta.new_token_ids
                        self.fair.charge(request.tenant, output_tokens=len(delta.new_token_ids))
                        done_text.append(delta.new_text)
                        delta.request_id = request.request_id
                        if door is not None:
                            door.first_token()
                            door.record.output_tokens += len(delta.new_token_ids)
                        if delta.finished and span.is_recording():
                            finish_span(self.tracing, parent, delta, len(done_tokens), attempt)
                        yield delta
                return
            except DrainingError:
                # A worker began draining after this door last polled it: route again (no
                # retry: nothing failed), under a new sub-request id.
                attempt -= 1
                reroutes += 1
                await self.membership.sync()
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
                retry_reason = f"{type(e).__name__}: {e}"[:200]
                if door is not None:
                    door.record.retries += 1
                await self.membership.sync()

    def _route(self, request: EngineRequest) -> Ticket:
        model = self.membership.model
        assert model is not None
        tokens = [*request.prompt_token_ids, *request.resume.output_token_ids]
        extra = b"" if request.lora is None else request.lora.hash_extra
        try:
            ticket = self.router.route(
                model.model_id,
                block_hashes=request.block_hashes,
                decode_block_hashes=self.router.hash_blocks(
                    model.model_id, tokens, (), extra, decode=True
                ),
                num_prompt_tokens=len(request.prompt_token_ids) + request.resume.num_output_tokens,
                num_output_tokens=request.params.max_tokens - request.resume.num_output_tokens,
                request_id=request.request_id,
                adapter=None if request.lora is None else request.lora.name,
            )
        except NoWorkerError as e:
            raise OverloadedError(f"no worker can take the request now: {e}", 2.0) from e
        return ticket

    # -- one attempt: route -> queue -> reserve -> prefill -> admit -> stream ------------------
    async def _attempt(
        self, request: EngineRequest, timeout_s: float, span: trace.Span
    ) -> AsyncIterator[OutputDelta]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        model = self.membership.model
        assert model is not None
        wait = self.router.config.late_binding and not self.gate.has_room(model.model_id)
        route_span = self.tracing.tracer.start_span(
            SpanName.ROUTE, context=trace.set_span_in_context(span)
        )
        with ending(route_span):
            ticket = self._route(request)
            if wait and ticket.decision.prefill_worker_id is not None:
                # Late binding: no prefill worker can take it now, so it is routed again when
                # one can. (Routing first tells whether its decode worker would prefill it,
                # which needs no room; the tentative decision is withdrawn.)
                ticket.close()
                with self.waits[WorkerRole.PREFILL].waiting():
                    ticket = await self.gate.bind(
                        model.model_id, lambda: self._route(request), timeout_s,
                        request.priority, request.tenant,
                    )  # fmt: skip
            if route_span.is_recording():
                route_span.set_attributes(route_attributes(ticket.decision))
        door = door_trace.current()
        if door is not None:
            door.record.prefill_worker = ticket.decision.prefill_worker_id
            door.record.decode_worker = ticket.decision.decode_worker_id
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
            attempt = Attempt(self, request, decode, prefill, deadline, span)
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
