"""The engine step: schedule, run, process outputs, collect.

An engine runs whole requests, prefill and decode, and knows no roles. Where KV crosses its
boundary it holds requests outside the schedule (engine/held.py): `reserve` blocks for a
prompt whose KV another engine computes (reusing its own prefix-cache hit, which is not
sent again), then `admit` it with its first token once the KV has landed (or `cache_landed`,
a prefix copied from a peer); and, when its KV connector asks (engine/kv_connector.py: the
prefill worker's), park a request after its first token until `release`, while its KV is
handed over.

A request that moved from another worker (`EngineRequest.resume`) starts with its resumed
output tokens (`engine.resume`): its "prompt KV" is prompt + resumed tokens, and its "first
token" is the first one sampled here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import torch

from core.config import EngineConfig
from core.errors import InvalidRequestError
from core.events import KVEventBatch, WorkerLoad
from core.hashing import model_root_hash
from core.kv_layout import KVLayout
from core.lora import LoRARef
from core.request import EngineRequest, FinishReason, OutputDelta, TokenLogprob, check_prompt
from core.roles import WorkerRole
from core.sampling import SamplingParams
from core.step_stats import StepTotals
from engine.config import ModelConfig
from engine.cuda_graphs import GraphCapturer
from engine.detokenizer import IncrementalDetokenizer
from engine.device import resolve_attention_backend, resolve_device, resolve_dtype
from engine.gguf import resolve_model
from engine.grammar.cache import GrammarCache
from engine.held import HeldRequests, NoCapacityError, Reservation
from engine.host_heap import keep_freed_memory
from engine.kv_cache.manager import KVCacheManager
from engine.kv_cache.restore_rule import attach_offload
from engine.kv_connector import KVConnector, prompts_completing
from engine.kv_events import KVEventFeed
from engine.model_runner import ModelRunner, SampledToken
from engine.overlap import StepsInFlight, overlap_enabled, took_token
from engine.parallel import SINGLE, TPGroup
from engine.request import Request, RequestStatus
from engine.resume import restore
from engine.sampler import make_generator
from engine.scheduler import Scheduler
from engine.spec import speculator_for
from engine.stop_checker import StopChecker
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

__all__ = ["LLMEngine", "NoCapacityError", "Reservation"]


class LLMEngine:
    def __init__(
        self,
        model_dir: str | Path,
        config: EngineConfig | None = None,
        tp: TPGroup = SINGLE,
        worker_id: str = "engine-0",
        capturer: GraphCapturer | None = None,
    ) -> None:
        self.config = config = config or EngineConfig()
        self.worker_id = worker_id
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        model_dir = resolve_model(model_dir)  # a GGUF file: its imported folder
        self.model_config = ModelConfig.from_dir(model_dir)
        self.tokenizer = Tokenizer.from_dir(model_dir)
        device = resolve_device(config.device)
        if device.type == "cpu":
            keep_freed_memory()
        dtype = resolve_dtype(config.dtype, self.model_config.dtype, device)
        backend = resolve_attention_backend(config.attention_backend, device)
        self.runner = ModelRunner(self.model_config, config, device, dtype, backend, tp)
        num_blocks = self.runner.kv_layout.num_blocks - self.runner.plan_graphs(capturer)
        self.root_hash = model_root_hash(self.model_config.model_id, config.block_size)
        self.kv = KVCacheManager(
            num_blocks, config.block_size, self.root_hash, config.enable_prefix_caching
        )
        if config.kv_offload_host_bytes:  # the tiers that beat recomputing (measured)
            attach_offload(self.kv.pool, self.runner, config, tp)
        limits = [self.model_config.max_position_embeddings, num_blocks * config.block_size]
        if config.max_model_len:
            limits.append(config.max_model_len)
        if self.model_config.sliding_window:
            limits.append(self.model_config.sliding_window)  # no sliding-window attention yet
        self.max_model_len = min(limits)
        speculator = speculator_for(config, self.max_model_len, self.runner)
        self.scheduler = Scheduler(config, self.kv, speculator)
        self.runner.capture_graphs(self.max_model_len)
        self.eos_token_ids = self.model_config.eos_token_ids or self.tokenizer.eos_token_ids
        self.grammars = GrammarCache(self.tokenizer, self.model_config, self.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.held = HeldRequests(self.kv)
        self.kv_events = KVEventFeed(worker_id, self.model_config.model_id)
        self.step_totals = StepTotals()
        overlap = overlap_enabled(config, self.runner.device.type)
        self.in_flight = StepsInFlight(self.scheduler, self.kv, self.step_totals, overlap)
        self.kv_connector: KVConnector | None = None
        """Set by a worker whose KV leaves this engine (see kv_connector.py)."""
        logger.info("engine %s: %d KV blocks of %d tokens, max_model_len=%d, backend=%s, "
                    "steps overlapped: %s", worker_id, num_blocks, config.block_size,
                    self.max_model_len, backend, overlap)  # fmt: skip

    # -- requests ------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        tenant: str = "",
        lora: LoRARef | None = None,
    ) -> Request:
        """Check and queue a request; a bad one raises ValueError and changes nothing."""
        request = replace(
            self.prepare(request_id, prompt, params), priority=priority, tenant=tenant, lora=lora
        )
        return self.enqueue(request, arrival_time)

    def prepare(
        self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None
    ) -> EngineRequest:
        """A prompt (text or token ids) checked against this engine, as `enqueue` and
        `reserve` take it. Raises ValueError (InvalidRequestError) if it is bad."""
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_prompt(token_ids, self.max_model_len, self.model_config.vocab_size)
        return EngineRequest(request_id, token_ids, params or SamplingParams())

    def enqueue(self, request: EngineRequest, arrival_time: float | None = None) -> Request:
        """Queue a prepared request (checked by `prepare`, or by the cluster's front door)."""
        req = self._new_request(request, arrival_time)
        self.requests[req.request_id] = req
        self.scheduler.add(req)
        return req

    def _new_request(self, request: EngineRequest, arrival_time: float | None) -> Request:
        request_id, token_ids, params = request.request_id, request.prompt_token_ids, request.params
        if request_id in self.requests or request_id in self.held:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        lora_weights = self._lora_weights(request.lora)
        req = Request(
            request_id,
            list(token_ids),
            params,
            block_hashes=list(request.block_hashes)
            if request.block_size in (0, self.config.block_size)
            else [],
            priority=request.priority,
            tenant=request.tenant,
            lora=request.lora,
            lora_weights=lora_weights,
        )
        if arrival_time is not None:
            req.arrival_time = req.timings.arrival = arrival_time
        req.arrival_step = self.step_totals.steps
        spec = self.scheduler.speculator
        req.sample_seed = spec.sample_seed(params) if spec else params.seed
        req.generator = make_generator(req.sample_seed)
        req.detokenizer = IncrementalDetokenizer(
            self.tokenizer, token_ids, params.skip_special_tokens
        )
        req.stop_checker = StopChecker(
            params, self.eos_token_ids, self.max_model_len, len(token_ids)
        )
        restore(req, request.resume, self.model_config.vocab_size)
        req.grammar = self.grammars.start(params.structured_outputs, req.output_token_ids)
        return req

    def _lora_weights(self, ref: LoRARef | None) -> Any:
        """The adapter `ref` names, read and checked (None for the base model)."""
        if ref is None:
            return None
        if self.runner.lora is None:
            raise InvalidRequestError(
                f"model: {ref.name!r} is a LoRA adapter; this engine serves none (max_loras=0)"
            )
        return self.runner.lora.check(ref)

    def abort(self, request_id: str) -> bool:
        """Cancel a request anywhere in its life and free its blocks."""
        if self.kv_connector is not None:
            self.kv_connector.forget(request_id)
        req = self.requests.pop(request_id, None) or self.held.pop(request_id)
        if req is None:
            return False
        if req.status != RequestStatus.FINISHED:
            req.finish_reason = FinishReason.ABORT
            self.in_flight.finish(req)
        else:
            self.kv.free(req)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0 or self.in_flight.launched is not None

    def num_in_flight(self) -> int:
        """Requests that still hold blocks here: scheduled, or parked / reserved."""
        return self.scheduler.num_unfinished + len(self.held)

    def is_held(self, request_id: str) -> bool:
        """Parked (prefilled, until `release`) or reserved (until its KV lands)."""
        return request_id in self.held

    # -- the step ------------------------------------------------------------------------
    def step(self) -> list[OutputDelta]:
        """Schedule, run, process outputs. Returns a delta for every request that got a
        token or finished this step; with overlapped steps (engine/overlap.py), of the step
        before, this one left running on the device."""
        flight = self.in_flight
        if flight.launched is not None and not flight.run_ahead():
            return self._processed(flight.land())
        totals = self.step_totals
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch:
            return self._processed(flight.land()) if flight.launched is not None else []
        scheduled = time.perf_counter()
        totals.schedule_s += scheduled - start
        totals.steps += 1
        connector, hook = self.kv_connector, None
        if connector is not None:
            hook = connector.begin_step(prompts_completing(batch.items, self.kv.block_ids))
        launched = self.runner.launch(batch, self.kv, hook, totals, flight.launched)
        batch.mark_computed(totals)
        outputs = self._processed(flight.swap(launched))
        if not flight.enabled or connector is not None:
            outputs += self._processed(flight.land())
            if connector is not None:
                connector.end_step()
        return outputs

    def _processed(self, sampled: list[SampledToken]) -> list[OutputDelta]:
        totals = self.step_totals
        if self.scheduler.speculator is not None:
            sampled = self.scheduler.speculator.accept(sampled, totals)
        processing = time.perf_counter()
        # A request can finish at any of its tokens; what it sampled past that is dropped.
        done = RequestStatus.FINISHED
        outputs = []
        for s in sampled:
            took_token(s)
            if s.request.status != done:
                outputs.append(self._process(s))
        totals.output_s += time.perf_counter() - processing
        return outputs

    def _process(self, s: SampledToken) -> OutputDelta:
        req = s.request
        now = time.monotonic()
        if req.timings.first_token is None:
            req.timings.first_token = now
        req.append_token(s.token_id)
        detok = req.detokenizer
        detok.append(s.token_id)
        decision = req.stop_checker.check(req.output_token_ids, detok.text)
        if req.grammar is not None and not decision.finished:
            decision = req.grammar.after_token(s.token_id) or decision
        if decision.finished:
            detok.flush()
            req.finish_reason = decision.finish_reason
            req.stop_reason = decision.stop_reason
            req.timings.finished = now
        visible = req.stop_checker.visible_len(detok.text, decision.finished)
        new_text = detok.text[req.num_sent_chars : visible]
        req.num_sent_chars = max(req.num_sent_chars, visible)
        new_logprobs = None if req.params.logprobs is None else [s.logprob]
        out = self._delta(req, s.token_id, new_text, new_logprobs, decision.finished)
        connector = self.kv_connector
        if (
            req.num_sampled_here == 1
            and connector is not None
            and connector.request_prefilled(req, s.token_id, s.logprob, out)
        ):
            # Parked even when the first token ended it: a transfer may still read its KV.
            self.scheduler.running.remove(req)
            self.requests.pop(req.request_id, None)
            self.held.park(req)
        elif decision.finished:
            self.in_flight.finish(req)
            self.requests.pop(req.request_id, None)
        return out

    def _delta(
        self,
        req: Request,
        token_id: int,
        new_text: str,
        new_logprobs: list[TokenLogprob | None] | None,
        finished: bool,
    ) -> OutputDelta:
        spec = req.spec_stats
        return OutputDelta(
            request_id=req.request_id,
            new_token_ids=[token_id],
            new_text=new_text,
            new_logprobs=new_logprobs,  # type: ignore[arg-type]
            prompt_logprobs=req.take_prompt_logprobs(),
            finished=finished,
            finish_reason=req.finish_reason,
            stop_reason=req.stop_reason,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            num_draft_tokens=spec.drafted if spec else 0,
            num_accepted_tokens=spec.accepted if spec else 0,
            timings=req.timings,
        )

    # -- KV across the boundary (engine/held.py) --------------------------------------
    def reserve(self, request: EngineRequest) -> Reservation:
        """Reserve blocks for a prompt whose KV another engine computes. Blocks this engine
        already caches for the prompt's prefix are reused and need not be sent."""
        return self.held.reserve(self._new_request(request, None))

    def admit(
        self, request_id: str, first_token: int, logprob: TokenLogprob | None = None
    ) -> OutputDelta:
        """The reserved blocks now hold the prompt's KV: join the running batch with the
        first token (sampled where the prompt was computed)."""
        req = self.held.land(request_id)
        req.timings.first_scheduled = req.timings.first_scheduled or time.monotonic()
        self.requests[request_id] = req
        self.scheduler.admit_landed(req)
        return self._process(SampledToken(req, first_token, logprob))

    def cache_landed(self, request_id: str) -> int:
        """The reserved blocks now hold a prefix copied from a peer: name them in the prefix
        cache and free them, so the prompt that follows hits them. Returns the number of
        blocks cached."""
        req = self.held.land(request_id)
        num_blocks = len(self.kv.block_ids(request_id))
        self.kv.free(req)
        return num_blocks

    def release(self, request_id: str, evict_first: bool = False) -> None:
        """A parked request's KV has been handed over: free its blocks (they stay in the
        prefix cache; with `evict_first`, as its first victims: a prefix a peer pulled lives
        on in the peer's cache)."""
        self.held.release(request_id, evict_first)

    # -- reporting -----------------------------------------------------------------------
    def take_kv_events(self) -> KVEventBatch | None:
        return self.kv_events.take(self.kv.pool)

    def kv_snapshot(self) -> KVEventBatch:
        """Everything this engine caches, as one batch that replaces the receiver's view
        (a router that missed events asks for this)."""
        return self.kv_events.snapshot(self.kv.pool)

    def load(self) -> WorkerLoad:
        waiting = list(self.scheduler.waiting)
        oldest = self.scheduler.oldest_unanswered_arrival()
        return WorkerLoad(
            worker_id=self.worker_id,
            role=WorkerRole.UNIFIED,  # whole requests; a worker reports its own role
            num_running=len(self.scheduler.running),
            num_waiting=len(waiting),
            num_waiting_tokens=self.scheduler.prefill_backlog(),
            num_free_blocks=self.kv.pool.num_free_blocks,
            num_total_blocks=self.kv.pool.num_blocks,
            timestamp=time.time(),
            num_prompt_tokens=self.kv.num_prompt_tokens,
            num_cached_prompt_tokens=self.kv.num_cached_prompt_tokens,
            steps=self._totals(),
            oldest_wait_s=0.0 if oldest is None else time.monotonic() - oldest,
            max_num_seqs=self.config.max_num_seqs,
            adapters=tuple(self.runner.lora.resident) if self.runner.lora is not None else (),
            max_loras=self.config.max_loras,
        )

    def kv_layout(self) -> KVLayout:
        """The KV cache's layout here (on a tensor-parallel rank: its shard's KV heads)."""
        return self.runner.kv_layout

    def _totals(self) -> StepTotals:
        """The step totals, with the offload tiers' block counts (kept by the tiers)."""
        totals = msgspec.structs.replace(self.step_totals)
        offload = self.kv.pool.offload
        if offload is not None:
            totals.spilled_blocks = offload.tiers[0].stats.stored
            totals.restored_blocks = sum(tier.stats.restored for tier in offload.tiers)
            totals.tier_restored_blocks = [tier.stats.restored for tier in offload.tiers]
            totals.tier_restore_s = [tier.stats.restore_s for tier in offload.tiers]
            totals.swapped_blocks = offload.num_swapped_out
        return totals

    def check_invariants(self) -> None:
        self.kv.pool.check_invariants()
