"""Overlapped steps: the engine launches step N+1 before step N's tokens reach the host.

A step on a GPU is the host's work (schedule, lay the batch out, process the last tokens:
detokenize, check stops, build deltas) and then the device's; in series, the device waits
for the host every step: ~0.9 ms of host work at batch 64 on a fast core, beside a decode
step of a few ms. Overlapped, the host schedules and lays out step N+1 while the device runs
step N, launches it, and only then waits for step N's tokens and processes them: the device
goes from one step to the next without waiting (vLLM's async scheduling, SGLang's overlap
scheduler).

Step N+1 is scheduled before step N's tokens are known: each request that samples in step N
runs ahead with one pending token (`Request.num_pending`: counted in its length, not yet in
its token ids), and step N+1 reads that token where step N's sampler left it, on the device
(`ModelRunner.launch`'s `ahead`). A request whose next row needs the token on the host runs
no step ahead, and the engine then processes step N before scheduling more: a grammar's mask,
penalties over the output so far; an engine that speculates or hands KV to a connector
processes every step before the next. A request that finishes at step N may have a row in step N+1:
that token is dropped, and its blocks are freed once step N+1 has run (a transfer into a
freed block must not race the step still writing its last slot). A request whose length
ends it after step N's token runs no step ahead at all. The sampled tokens and logprobs come
to the host by copies queued on the stream; nothing else in a step's sampling reads the
device's values on CUDA (a top-p-only row's nucleus threshold comes from a Triton kernel
there, not from a check on the host whether its best 1024 tokens hold it:
engine/sampling/filters.py, engine/kernels/nucleus.py).
"""

from __future__ import annotations

import time

from core.config import EngineConfig
from core.step_stats import StepTotals
from engine.kv_cache.manager import KVCacheManager
from engine.model_runner import LaunchedStep, SampledToken
from engine.request import Request, RequestStatus
from engine.sampling.penalties import has_penalty
from engine.scheduler import Scheduler


def overlap_enabled(config: EngineConfig, device_type: str) -> bool:
    """Whether an engine overlaps its steps: as configured, else where the device runs
    asynchronously (CUDA); never with speculation. Tensor-parallel ranks overlap alike: each
    makes the same decisions, so their steps' collectives still line up."""
    wanted = config.overlap_steps if config.overlap_steps is not None else device_type == "cuda"
    return wanted and not config.speculative


def needs_host_tokens(req: Request) -> bool:
    """Whether `req`'s next row needs its last token on the host: a grammar's token mask,
    or penalties over its output."""
    p = req.params
    penalized = has_penalty(p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
    return req.grammar is not None or penalized


class StepsInFlight:
    """The engine's step on the device, and the blocks that wait for it."""

    def __init__(
        self, scheduler: Scheduler, kv: KVCacheManager, totals: StepTotals, enabled: bool
    ) -> None:
        """`totals`: where the wait for a step's tokens goes (its `sample_s`), and the count
        of steps launched with the one before in flight (`overlapped_steps`)."""
        self.scheduler = scheduler
        self.kv = kv
        self.totals = totals
        self.enabled = enabled
        self.launched: LaunchedStep | None = None
        self._free_after: list[Request] = []

    def run_ahead(self) -> bool:
        """Give each request that samples in the step in flight its pending token, so the
        next step can be scheduled now. False (nothing changed) where one cannot run ahead:
        the step in flight must be processed first."""
        assert self.launched is not None
        ahead = [r for r, _ in self.launched.to_sample if r.status != RequestStatus.FINISHED]
        if any(needs_host_tokens(r) or r.draft_token_ids for r in ahead):
            return False
        for req in ahead:
            if not req.stop_checker.ends_by_length(len(req.output_token_ids) + 1):
                req.num_pending = 1
        return True

    def swap(self, launched: LaunchedStep) -> list[SampledToken]:
        """`launched` is now in flight: the tokens of the step before it (waited for; none
        if none was in flight), with the blocks that waited for that step freed."""
        before, self.launched = self.launched, launched
        if before is None:
            return []
        self.totals.overlapped_steps += 1
        return self._landed(before)

    def land(self) -> list[SampledToken]:
        """Wait for the step in flight: its tokens, with the blocks that waited for it freed."""
        assert self.launched is not None
        launched, self.launched = self.launched, None
        return self._landed(launched)

    def _landed(self, step: LaunchedStep) -> list[SampledToken]:
        start = time.perf_counter()
        freed, self._free_after = self._free_after, []
        try:
            return step.tokens()
        finally:  # a failed step (a broken device) still gives its blocks back
            self.totals.sample_s += time.perf_counter() - start
            for req in freed:
                self.kv.free(req)

    def finish(self, req: Request) -> None:
        """End `req` (finished or aborted): its blocks are freed now, or once the step in
        flight that writes to them has run."""
        launched = self.launched
        if launched is not None and any(r is req for r, _ in launched.batch.items):
            self.scheduler.finish(req, keep_blocks=True)
            self._free_after.append(req)
        else:
            self.scheduler.finish(req)


def took_token(s: SampledToken) -> None:
    """`s`'s request now has the token it counted as pending (if it ran ahead)."""
    if s.request.num_pending:
        s.request.num_pending -= 1
