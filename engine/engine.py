"""The engine step: schedule, run, process outputs, collect.

One `LLMEngine` serves one role:

- `unified`: whole requests, prefill and decode.
- `prefill`: runs a prompt, samples the first token, then parks the request with its blocks
  held (`take_prefilled`) until the KV has been handed over and `release` is called.
- `decode`: `reserve` blocks for a prompt whose KV another engine will write (reusing its own
  prefix-cache hit, which is not sent again), then `admit_transferred` with the first token
  once the KV has landed; from there it decodes like unified.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from core.config import EngineConfig
from core.events import AllBlocksCleared, BlockStored, KVEvent, KVEventBatch, WorkerLoad
from core.hashing import model_root_hash
from core.request import FinishReason, RequestOutput, TokenLogprob
from core.sampling import SamplingParams
from engine.config import ModelConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.device import resolve_attention_backend, resolve_device, resolve_dtype
from engine.kv_cache.manager import KVCacheManager
from engine.kv_connector import KVConnector
from engine.model_runner import ModelRunner, SampledToken
from engine.parallel import SINGLE, TPGroup
from engine.request import Request, RequestStatus
from engine.sampler import make_generator
from engine.scheduler import Scheduler
from engine.stop_checker import StopChecker
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class NoCapacityError(RuntimeError):
    """The KV cache cannot hold this request now (a retryable condition)."""


@dataclass(frozen=True)
class PrefillResult:
    """Prefill role: a prompt's KV is in `block_ids` and its first token is sampled."""

    request_id: str
    first_token: int
    logprob: TokenLogprob | None
    block_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int
    output: RequestOutput
    """`finished` when the first token already ends the request (nothing left to decode;
    the blocks are still held until `release`)."""


@dataclass(frozen=True)
class Reservation:
    """Decode role: blocks reserved for a prompt; the sender writes tokens
    [num_cached_tokens, num_prompt_tokens) into block_ids[num_cached_tokens // block_size:]."""

    request_id: str
    block_ids: list[int]
    num_cached_tokens: int


class LLMEngine:
    def __init__(
        self,
        model_dir: str | Path,
        config: EngineConfig | None = None,
        tp: TPGroup = SINGLE,
        worker_id: str = "engine-0",
    ) -> None:
        self.config = config = config or EngineConfig()
        self.worker_id = worker_id
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model_config = ModelConfig.from_dir(model_dir)
        self.tokenizer = Tokenizer.from_dir(model_dir)
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, self.model_config.dtype, device)
        backend = resolve_attention_backend(config.attention_backend, device)
        self.runner = ModelRunner(self.model_config, config, device, dtype, backend, tp)
        num_blocks = self.runner.kv_layout.num_blocks
        self.root_hash = model_root_hash(self.model_config.model_id, config.block_size)
        self.kv = KVCacheManager(
            num_blocks, config.block_size, self.root_hash, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config, self.kv)
        limits = [self.model_config.max_position_embeddings, num_blocks * config.block_size]
        if config.max_model_len:
            limits.append(config.max_model_len)
        if self.model_config.sliding_window:
            limits.append(self.model_config.sliding_window)  # no sliding-window attention yet
        self.max_model_len = min(limits)
        self.eos_token_ids = self.model_config.eos_token_ids or self.tokenizer.eos_token_ids
        self.requests: dict[str, Request] = {}
        self._prefilled: list[PrefillResult] = []
        self._held: dict[str, Request] = {}
        self._event_seq = 0
        self.kv_connector: KVConnector | None = None
        """Set by a prefill worker to ship each finished layer's KV (see kv_connector.py)."""
        logger.info(
            "engine %s: role=%s, %d KV blocks of %d tokens, max_model_len=%d, backend=%s",
            worker_id,
            config.role,
            num_blocks,
            config.block_size,
            self.max_model_len,
            backend,
        )

    # -- requests ------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> Request:
        """Queue a request; a bad one raises ValueError and changes nothing."""
        req = self._new_request(request_id, prompt, params, arrival_time)
        self.requests[request_id] = req
        self.scheduler.add(req)
        return req

    def _new_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None,
        arrival_time: float | None,
    ) -> Request:
        params = params or SamplingParams()
        if request_id in self.requests or request_id in self._held:
            raise ValueError(f"request id {request_id!r} is already in use")
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not token_ids:
            raise ValueError("the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; this model's context holds "
                f"{self.max_model_len} (prompt plus at least one generated token)"
            )
        req = Request(request_id, token_ids, params)
        if arrival_time is not None:
            req.arrival_time = req.timings.arrival = arrival_time
        req.generator = make_generator(params.seed)
        req.detokenizer = IncrementalDetokenizer(
            self.tokenizer, token_ids, params.skip_special_tokens
        )
        req.stop_checker = StopChecker(
            params, self.eos_token_ids, self.max_model_len, len(token_ids)
        )
        return req

    def abort(self, request_id: str) -> bool:
        """Cancel a request anywhere in its life and free its blocks."""
        req = self.requests.pop(request_id, None) or self._held.pop(request_id, None)
        if req is None:
            return False
        if req.status != RequestStatus.FINISHED:
            req.finish_reason = FinishReason.ABORT
            self.scheduler.finish(req)
        else:
            self.kv.free(req)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # -- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run, process outputs. Returns an output for every request that got a
        token or finished this step."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        hook = None
        if self.kv_connector is not None:
            completing = [
                (req, self.kv.block_ids(req.request_id))
                for req, n in batch.items
                if req.num_computed_tokens + n == req.num_tokens and not req.output_token_ids
            ]
            hook = self.kv_connector.begin_step(completing)
        sampled = self.runner.execute(batch, self.kv, hook)
        for req, n in batch.items:
            req.num_computed_tokens += n
        outputs = [self._process(s) for s in sampled]
        if self.kv_connector is not None:
            self.kv_connector.end_step()
        return outputs

    def _process(self, s: SampledToken) -> RequestOutput:
        req = s.request
        now = time.monotonic()
        if req.timings.first_token is None:
            req.timings.first_token = now
        req.append_token(s.token_id)
        if req.logprobs is not None and s.logprob is not None:
            req.logprobs.append(s.logprob)
        req.detokenizer.append(s.token_id)
        decision = req.stop_checker.check(req.output_token_ids, req.detokenizer.text)
        if decision.finished:
            req.detokenizer.flush()
        req.text = req.stop_checker.visible_text(req.detokenizer.text, decision.finished)
        if decision.finished:
            req.finish_reason = decision.finish_reason
            req.stop_reason = decision.stop_reason
            req.timings.finished = now
        if self.config.role == "prefill" and len(req.output_token_ids) == 1:
            return self._park_prefilled(req, s, decision.finished)
        if decision.finished:
            self.scheduler.finish(req)
            self.requests.pop(req.request_id, None)
        return self._output(req)

    def _output(self, req: Request) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            token_ids=list(req.output_token_ids),
            text=req.text,
            finished=req.status == RequestStatus.FINISHED,
            finish_reason=req.finish_reason,
            stop_reason=req.stop_reason,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            logprobs=list(req.logprobs) if req.logprobs is not None else None,
            timings=req.timings,
        )

    # -- prefill role --------------------------------------------------------------------
    def _park_prefilled(self, req: Request, s: SampledToken, finished: bool) -> RequestOutput:
        """Take the request out of the batch but keep its blocks until `release`: a
        transfer may still be reading them (even when the first token ended the request)."""
        out = self._output(req)
        out.finished = finished
        self.scheduler.running.remove(req)
        req.status = RequestStatus.FINISHED
        self.requests.pop(req.request_id, None)
        self._held[req.request_id] = req
        self._prefilled.append(self._prefill_result(req, s, out, self.kv.block_ids(req.request_id)))
        return out

    def _prefill_result(
        self, req: Request, s: SampledToken, out: RequestOutput, block_ids: list[int]
    ) -> PrefillResult:
        return PrefillResult(
            request_id=req.request_id,
            first_token=s.token_id,
            logprob=s.logprob,
            block_ids=block_ids,
            num_prompt_tokens=req.num_prompt_tokens,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            output=out,
        )

    def take_prefilled(self) -> list[PrefillResult]:
        results, self._prefilled = self._prefilled, []
        return results

    def release(self, request_id: str) -> None:
        """Prefill role: the KV of a parked request has been handed over; free its blocks
        (they stay in the prefix cache)."""
        req = self._held.pop(request_id, None)
        if req is not None:
            self.kv.free(req)

    # -- decode role ---------------------------------------------------------------------
    def reserve(
        self, request_id: str, prompt: list[int], params: SamplingParams | None = None
    ) -> Reservation:
        """Reserve blocks for a prompt whose KV another engine computes. Blocks this engine
        already caches for the prompt's prefix are reused and need not be sent."""
        req = self._new_request(request_id, prompt, params, None)
        hits = self.kv.get_computed_blocks(req)
        num_hit_tokens = len(hits) * self.kv.block_size
        if not self.kv.allocate_slots(req, req.num_prompt_tokens - num_hit_tokens, hits):
            raise NoCapacityError(
                f"no room for {req.num_prompt_tokens} prompt tokens "
                f"({self.kv.pool.num_free_blocks} free blocks)"
            )
        req.num_computed_tokens = num_hit_tokens
        req.num_cached_tokens = num_hit_tokens
        req.status = RequestStatus.WAITING_FOR_KV
        self._held[request_id] = req
        return Reservation(request_id, self.kv.block_ids(request_id), num_hit_tokens)

    def admit_transferred(
        self, request_id: str, first_token: int, logprob: TokenLogprob | None = None
    ) -> RequestOutput:
        """The reserved blocks now hold the prompt's KV: join the running batch."""
        req = self._held.pop(request_id, None)
        if req is None or req.status != RequestStatus.WAITING_FOR_KV:
            raise KeyError(f"no reservation waiting for KV under request id {request_id!r}")
        req.num_computed_tokens = req.num_prompt_tokens
        self.kv.cache_computed_blocks(req)
        req.timings.first_scheduled = req.timings.first_scheduled or time.monotonic()
        self.requests[request_id] = req
        self.scheduler.admit_transferred(req)
        return self._process(SampledToken(req, first_token, logprob))

    # -- reporting -----------------------------------------------------------------------
    def take_kv_events(self) -> KVEventBatch | None:
        events: list[KVEvent] = self.kv.pool.take_events()
        if self._event_seq == 0:
            events.insert(0, AllBlocksCleared())  # a (re)started worker's view begins empty
        elif not events:
            return None
        return self._event_batch(events)

    def kv_snapshot(self) -> KVEventBatch:
        """Everything this engine caches, as one batch that replaces the receiver's view
        (a router that missed events asks for this)."""
        self.kv.pool.take_events()  # superseded by the snapshot
        hashes = self.kv.pool.cached_hashes()
        events: list[KVEvent] = [AllBlocksCleared()]
        if hashes:
            events.append(BlockStored(parent=None, block_hashes=hashes))
        return self._event_batch(events)

    def _event_batch(self, events: list[KVEvent]) -> KVEventBatch:
        batch = KVEventBatch(
            worker_id=self.worker_id,
            seq=self._event_seq,
            events=events,
            timestamp=time.time(),
            model=self.model_config.model_id,
        )
        self._event_seq += 1
        return batch

    def load(self) -> WorkerLoad:
        waiting = list(self.scheduler.waiting)
        return WorkerLoad(
            worker_id=self.worker_id,
            role=self.config.role,
            num_running=len(self.scheduler.running),
            num_waiting=len(waiting),
            num_waiting_tokens=sum(r.num_tokens - r.num_computed_tokens for r in waiting),
            num_free_blocks=self.kv.pool.num_free_blocks,
            num_total_blocks=self.kv.pool.num_blocks,
            timestamp=time.time(),
        )

    def check_invariants(self) -> None:
        self.kv.pool.check_invariants()
