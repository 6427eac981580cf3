"""Request orchestration across the pools: the cluster's `Backend`.

For each request (DESIGN.md, "Request path"):

  1. the router picks a decode worker D and, unless D prefills it itself, a prefill worker P;
     the request waits its turn in P's admission queue (router.cluster.prefill_gate)
  2. D reserves blocks (reusing its cached prefix) and arms its transport    -> block ids
  3. P prefills (reusing its own cached prefix), sending each layer's KV into D's blocks
     as soon as the layer is done                                             -> first token
  4. D waits for every layer, admits the request and streams tokens back

Every await has a deadline. If a worker dies mid-request, the request is retried on
another one, re-prefilled with the tokens generated so far, so the client's stream goes on
without repeating or skipping a token; after `max_retries` it fails with a clear error.
A client that goes away cancels the request on both workers (blocks freed).

A background task keeps the router in step with the controller's membership and polls
every worker's report (KV events -> index, load -> policies, prefix-hit counters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from core.errors import (
    BatonError,
    DeadlineExceededError,
    InvalidRequestError,
    KVCapacityError,
    OverloadedError,
    WorkerFailedError,
)
from core.request import RequestOutput
from router.cluster.prefill_gate import PrefillGate
from router.frontdoor.backend import GenerateRequest
from router.routing.router import NoWorkerError, Router

logger = logging.getLogger(__name__)

_ACTOR_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)
_WORKER_GONE = (*_ACTOR_GONE, WorkerFailedError)


def _retryable(e: BaseException) -> bool:
    """The worker, not the request, failed: the actor is gone, a worker said so, or a worker
    raised something that is not one of our request errors (a broken engine)."""
    if isinstance(e, _WORKER_GONE):
        return True
    return isinstance(e, RayTaskError) and not isinstance(e, BatonError)


_SUSPECT_S = 30.0
"""How long a worker whose actor died stays out of routing unless the controller says
otherwise (it usually reports the death within a health-check interval)."""


@dataclass
class WorkerStats:
    """The latest report of one worker, for metrics and the admin page."""

    worker_id: str
    role: str
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        return (
            self.num_cached_prompt_tokens / self.num_prompt_tokens
            if self.num_prompt_tokens
            else 0.0
        )


@dataclass
class TransferStats:
    num_transfers: int = 0
    num_blocks_sent: int = 0
    num_blocks_skipped: int = 0
    """Prompt blocks the decode worker already held (multi-turn reuse): never sent."""
    prefill_on_decode: int = 0
    wait_s: float = 0.0
    """Total time decode workers waited for KV after the prefill's first token."""


class ClusterBackend:
    def __init__(
        self,
        controller: Any,
        router: Router,
        model_name: str,
        tokenizer: Any,
        max_retries: int = 2,
        poll_interval_s: float = 0.05,
        metrics: Any = None,
        prefill_queue_tokens: int = 4096,
        max_kv_wait_s: float = 30.0,
    ) -> None:
        """`prefill_queue_tokens`: uncached prompt tokens admitted to one prefill worker at a
        time (router.cluster.prefill_gate); about two engine steps' token budget. `max_kv_wait_s`:
        how long a request waits for a decode worker's KV blocks to free up before 429."""
        self.controller = controller
        self.router = router
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.max_retries = max_retries
        self.max_kv_wait_s = max_kv_wait_s
        self.poll_interval_s = poll_interval_s
        self.model_id = ""
        self.max_model_len = 0
        self.block_size = 16
        self.num_layers = 0
        self.workers: dict[str, Any] = {}
        """worker id -> controller Member (state ready)."""
        self.stats: dict[str, WorkerStats] = {}
        self.transfers = TransferStats()
        self.gate = PrefillGate(prefill_queue_tokens)
        self.metrics = metrics
        """router.frontdoor.metrics.Metrics, if the front doors export them."""
        self.kv_bytes_per_block = 0
        self._version = -1
        self._prefill_pool_wanted = True
        """False when the prefill pool is scaled to 0 (decode workers then serve alone)."""
        self._task: asyncio.Task | None = None
        self._resync: set[str] = set()
        self._suspects: dict[str, float] = {}
        """Workers whose actor died under a request, by when they were seen dead."""
        router.store.set_resync_callback(lambda _model, worker_id: self._resync.add(worker_id))

    # -- membership and reports ------------------------------------------------------------
    async def start(self) -> None:
        await self.sync_members()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def is_ready(self) -> bool:
        roles = {m.role for m in self.workers.values()}
        return (
            "unified" in roles
            or {"prefill", "decode"} <= roles
            or ("decode" in roles and not self._prefill_pool_wanted)
        )

    def _suspect(self, worker_id: str) -> None:
        """An actor call failed because the actor is gone: stop routing to it now rather
        than wait for the controller's next health check."""
        self._suspects[worker_id] = time.monotonic()
        if self.workers.pop(worker_id, None) is not None:
            self.stats.pop(worker_id, None)
            self.router.remove_worker(worker_id)
            logger.warning("router: worker %s is gone; no longer routing to it", worker_id)

    async def sync_members(self) -> None:
        version, members = await self.controller.get_members.remote()
        if version == self._version:
            return
        self._version = version
        # Pool sizes only matter when membership changed (scaling bumps the version too).
        desired = await self.controller.get_desired.remote()
        self._prefill_pool_wanted = desired.get("prefill", 0) > 0
        ready = {m.worker_id: m for m in members if m.state == "ready"}
        for wid in list(self.workers):
            if wid not in ready:
                del self.workers[wid]
                self.stats.pop(wid, None)
                self.router.remove_worker(wid)
                self.gate.drop_worker(wid)
                if self.metrics is not None:
                    self.metrics.forget_worker(wid)
                logger.info("router: worker %s left", wid)
        now = time.monotonic()
        self._suspects = {w: t for w, t in self._suspects.items() if now - t < _SUSPECT_S}
        for wid, m in ready.items():
            if wid in self.workers or wid in self._suspects:
                continue
            info = m.info
            if not self.model_id:
                self.model_id = info.model_id
                self.max_model_len = info.max_model_len
                self.block_size = info.block_size
                self.kv_bytes_per_block = getattr(info, "kv_bytes_per_block", 0)
                self.router.register_model(self.model_id, info.block_size)
            self.workers[wid] = m
            self.stats[wid] = WorkerStats(wid, m.role)
            self.router.add_worker(wid, m.role, self.model_id)
            logger.info("router: worker %s (%s) joined", wid, m.role)

    async def _poll_forever(self) -> None:
        last_sync = 0.0
        while True:
            try:
                if time.monotonic() - last_sync > 0.25:
                    await self.sync_members()
                    last_sync = time.monotonic()
                await self.poll_reports()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("router: polling workers failed")
            await asyncio.sleep(self.poll_interval_s)

    async def poll_reports(self) -> None:
        for wid in list(self._resync):  # the index missed events of these: full snapshot
            self._resync.discard(wid)
            m = self.workers.get(wid)
            if m is not None:
                with contextlib.suppress(Exception):
                    self.router.apply(await asyncio.wait_for(m.handle.snapshot.remote(), 5.0))
        members = list(self.workers.values())
        refs = [m.handle.report.remote() for m in members]
        results = await asyncio.gather(
            *(asyncio.wait_for(r, 5.0) for r in refs), return_exceptions=True
        )
        for m, rep in zip(members, results, strict=True):
            if isinstance(rep, BaseException):
                continue
            if rep.events is not None:
                self.router.apply(rep.events)
            self.router.report_load(rep.load)
            s = self.stats.get(m.worker_id)
            if s is not None:
                s.num_running = rep.load.num_running
                s.num_waiting = rep.load.num_waiting
                total = rep.load.num_total_blocks
                s.kv_usage = 1.0 - rep.load.num_free_blocks / total if total else 0.0
                s.num_prompt_tokens = rep.num_prompt_tokens
                s.num_cached_prompt_tokens = rep.num_cached_prompt_tokens
                if self.metrics is not None:
                    self.metrics.record_worker(
                        m.worker_id,
                        num_running=s.num_running,
                        num_waiting=s.num_waiting,
                        kv_usage=s.kv_usage,
                        prefix_hit_rate=s.prefix_hit_rate,
                        num_used_blocks=total - rep.load.num_free_blocks,
                        num_free_blocks=rep.load.num_free_blocks,
                    )

    # -- the request path ------------------------------------------------------------------
    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.timeout_s
        if not self.workers:
            await self.sync_members()
        params = request.params
        prompt = list(request.prompt_token_ids)
        if self.max_model_len and len(prompt) >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt)} tokens; this model's context holds "
                f"{self.max_model_len} (prompt plus at least one generated token)"
            )
        done_tokens: list[int] = []
        done_text = ""
        done_logprobs: list = []
        attempt = 0
        while True:
            attempt += 1
            rid = request.request_id if attempt == 1 else f"{request.request_id}.retry{attempt - 1}"
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise DeadlineExceededError(f"request {request.request_id} passed its deadline")
            sub_params = replace(params, max_tokens=params.max_tokens - len(done_tokens))
            last: RequestOutput | None = None
            try:
                async for out in self._attempt(rid, prompt + done_tokens, sub_params, remaining):
                    last = out
                    yield self._merge(request, out, done_tokens, done_text, done_logprobs)
                return
            except OverloadedError:
                if attempt == 1:
                    raise
                # A retry found no live worker for a pool: the controller is replacing it.
                # Wait for it within the deadline rather than fail a half-served request.
                attempt -= 1
                await asyncio.sleep(0.5)
                await self.sync_members()
            except TimeoutError as e:
                raise DeadlineExceededError(
                    f"request {request.request_id} passed its deadline of {request.timeout_s} s"
                ) from e
            except Exception as e:
                if not _retryable(e):
                    raise
                if last is not None:  # keep what the client has already seen
                    done_tokens = done_tokens + list(last.token_ids)
                    done_text = done_text + last.text
                    done_logprobs = done_logprobs + list(last.logprobs or [])
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
                await self.sync_members()

    def _merge(
        self,
        request: GenerateRequest,
        out: RequestOutput,
        done_tokens: list[int],
        done_text: str,
        done_logprobs: list,
    ) -> RequestOutput:
        if not done_tokens:
            return out
        return replace(
            out,
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            token_ids=done_tokens + list(out.token_ids),
            text=done_text + out.text,
            logprobs=(done_logprobs + list(out.logprobs)) if out.logprobs is not None else None,
        )

    async def _attempt(
        self, rid: str, prompt: list[int], params: Any, timeout_s: float
    ) -> AsyncIterator[RequestOutput]:
        try:
            decision = self.router.route(
                self.model_id, prompt, request_id=rid, num_output_tokens=params.max_tokens
            )
        except NoWorkerError as e:
            raise OverloadedError(f"no worker can take the request now: {e}", 2.0) from e
        if self.metrics is not None:
            self.metrics.record_router_decision(self.router.config.prefill_policy)
        decode = self.workers.get(decision.decode_worker_id)
        prefill = (
            self.workers.get(decision.prefill_worker_id) if decision.prefill_worker_id else None
        )
        if decode is None or (decision.prefill_worker_id and prefill is None):
            raise WorkerFailedError("the routed worker just left the cluster")
        if prefill is not None and prefill.role != "prefill":
            prefill = None  # a unified worker prefills its own requests: no transfer

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        stream = None
        finished = False
        first_token_at: float | None = None
        calling = decode  # the worker whose call is in flight: the one to blame if it dies
        gated = False
        try:
            if prefill is None:
                self.transfers.prefill_on_decode += 1
                stream = decode.handle.generate.options(num_returns="streaming").remote(
                    rid, prompt, params, timeout_s
                )
            else:
                uncached = len(prompt) - decision.prefill_cached_blocks * self.block_size
                await self.gate.acquire(
                    prefill.worker_id, rid, uncached, max(0.1, deadline - loop.time())
                )
                gated = True
                reservation = await self._reserve(decode, rid, prompt, params, deadline)
                skip = reservation.num_cached_tokens // self.block_size
                calling = prefill
                reply = await asyncio.wait_for(
                    prefill.handle.prefill.remote(
                        rid,
                        prompt,
                        params,
                        decode.worker_id,
                        reservation.block_ids,
                        skip,
                        timeout_s,
                    ),
                    max(0.1, deadline - loop.time()),
                )
                self.router.prefill_done(rid)
                self.gate.release(prefill.worker_id, rid)
                gated = False
                calling = decode
                first_token_at = loop.time()
                self.transfers.num_transfers += 1
                self.transfers.num_blocks_sent += reply.num_blocks_sent
                self.transfers.num_blocks_skipped += skip
                if reply.output.finished:
                    decode.handle.abort.remote(rid)
                    finished = True
                    yield reply.output
                    return
                stream = decode.handle.admit.options(num_returns="streaming").remote(
                    rid, reply.first_token, reply.logprob, max(0.1, deadline - loop.time())
                )
            async for ref in stream:
                out = await asyncio.wait_for(ref, max(0.1, deadline - loop.time()))
                if prefill is not None and first_token_at is not None:
                    # The decode side's first output comes once every layer has landed: the
                    # time the KV transfer added after the prefill's first token.
                    waited = loop.time() - first_token_at
                    first_token_at = None
                    self.transfers.wait_s += waited
                    if self.metrics is not None:
                        self.metrics.record_kv_transfer(
                            reply.num_blocks_sent * self.kv_bytes_per_block, waited
                        )
                finished = out.finished
                yield out
                if finished:
                    return
        except Exception as e:
            if _retryable(e) and not isinstance(e, WorkerFailedError):
                self._suspect(calling.worker_id)  # dead, or its engine is broken
            raise
        finally:
            self.router.request_done(rid)
            if gated:
                self.gate.release(prefill.worker_id, rid)  # type: ignore[union-attr]
            if not finished:  # cancelled, failed or timed out: free blocks on both sides
                if stream is not None:
                    with contextlib.suppress(Exception):
                        ray.cancel(stream)
                for m in (decode, prefill):
                    if m is not None:
                        with contextlib.suppress(Exception):
                            m.handle.abort.remote(rid)

    async def _reserve(
        self, decode: Any, rid: str, prompt: list[int], params: Any, deadline: float
    ) -> Any:
        """Reserve the prompt's blocks on D. While D's KV is full, wait for its running
        requests to free blocks (bounded by the deadline and `max_kv_wait_s`) rather than
        refuse at once: a burst is queued, as a single engine would queue it."""
        loop = asyncio.get_running_loop()
        give_up = min(deadline, loop.time() + self.max_kv_wait_s)
        delay = 0.02
        while True:
            timeout = max(0.1, deadline - loop.time())
            try:
                return await asyncio.wait_for(
                    decode.handle.reserve.remote(rid, prompt, params, timeout), timeout
                )
            except KVCapacityError:
                if loop.time() + delay >= give_up:
                    raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)

    async def abort(self, request_id: str) -> None:
        for m in list(self.workers.values()):
            with contextlib.suppress(Exception):
                m.handle.abort.remote(request_id)
