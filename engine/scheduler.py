"""Continuous batching with chunked prefill and preemption: by recompute, or by swap with
offload tiers.

Each step spends a token budget (`max_num_batched_tokens`):

  0. If the next waiting request outranks running ones (a lower `priority`) and finds no
     room (blocks or sequence slots), the lowest-priority running requests are preempted
     for it, the most recently admitted first, until it fits.
  1. Running requests first, in arrival order: each asks for its remaining uncomputed
     tokens (1 when decoding, the rest of its prompt when mid-prefill), capped by the budget.
     If the pool has no room, a running request not yet scheduled this step is preempted
     (the lowest priority, the most recently admitted of those: its blocks freed, its
     computed count reset, back to the front of its class in the queue) until there is
     room or the request itself was the one preempted. Its full blocks stay in the prefix
     cache; with offload tiers they spill to host memory if evicted while it waits, and its
     partial last block is swapped there, so it resumes with nothing to recompute.
     A step runs at most `max_loras` LoRA adapters (engine/lora): a running request whose
     adapter finds no slot left sits the step out.
  2. Then waiting requests, in order, while budget, sequence slots, blocks and LoRA slots
     last; a new request first takes its prefix-cache hit, so only the rest of its prompt
     costs budget.
     The order is engine/wait_queue.py's: priority, then the tenant served least
     (core/fair_share.py), then first in; if the head does not fit, nothing behind it
     jumps ahead. What each step computes is charged to its request's tenant.
Preempted requests resume exactly (their output kept, its KV recomputed or swapped in).

A request whose tokens are all computed after this step gets a sampled token; a request that
got only part of its prompt (a chunk) does not. With speculation on, a running request about
to decode may ask for 1 + k tokens instead: its drafts (engine/spec/speculator.py). A
request whose prompt KV is in flight from another engine is not in these queues at all: the
engine holds it until the KV lands (engine/held.py), then `admit_landed` puts it straight
into the running batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from core.config import EngineConfig
from core.fair_share import FairShare
from core.lora import LoRARef
from core.perf import attention_pairs
from core.step_stats import StepTotals
from engine.kv_cache.manager import KVCacheManager
from engine.request import Request, RequestStatus
from engine.spec import Speculator
from engine.wait_queue import WaitQueue


@dataclass
class ScheduledBatch:
    """What to run this step: (request, number of new tokens) pairs, decodes (1 token, or
    1 + drafts) first, then chunks, so the runner lays the batch out as the attention
    backend expects."""

    items: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)

    def mark_computed(self, totals: StepTotals) -> None:
        """After the step ran: its real tokens have KV (drafts count once accepted,
        engine/spec), and the step's decode rows and prefill tokens go into `totals`."""
        for req, n in self.items:
            real = n - len(req.draft_token_ids)
            context = req.num_computed_tokens
            req.num_computed_tokens += real
            if real == 1:
                totals.decode_rows += 1
            else:
                totals.prefill_tokens += n
                totals.prefill_pairs += attention_pairs(n, context)

    def __bool__(self) -> bool:
        return bool(self.items)


def _layout_key(item: tuple[Request, int]) -> tuple[bool, str]:
    req, n = item
    return (n != 1 and not req.draft_token_ids, "" if req.lora is None else req.lora.name)


class Scheduler:
    def __init__(
        self, config: EngineConfig, kv: KVCacheManager, speculator: Speculator | None = None
    ) -> None:
        self.config = config
        self.kv = kv
        self.speculator = speculator
        self.fair = FairShare(config.fair_share)
        self.waiting = WaitQueue(self.fair)
        self.running: list[Request] = []
        self.num_preemptions = 0
        """Total preemptions since start (a metric: a high rate means the cache is too small)."""

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []

        # 0. room for a request that outranks running ones
        self._preempt_for_priority(batch, budget)

        # 1. running requests
        proposed = self._propose(budget)
        adapters: set[LoRARef] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if not self._adapter_fits(req, adapters):
                i += 1  # its adapter waits for a slot: the step's are all taken
                continue
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new == 0:
                i += 1  # its last token ends it, once the step in flight lands
                continue
            drafts = self._drafts(req, num_new, budget, proposed)
            num_new += len(drafts)
            while not self.kv.allocate_slots(req, num_new):
                victim = self.running.pop(self._victim(i))
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is req:
                    break
            else:
                real = req.num_computed_tokens + num_new - len(drafts)
                self.kv.cache_computed_blocks(req, real)  # real tokens only: drafts may fail
                req.draft_token_ids = drafts
                scheduled.append((req, num_new))
                budget -= num_new
                i += 1

        # 2. waiting requests
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting.head()
            assert req is not None
            if req.num_pending or not self._adapter_fits(req, adapters):
                break  # preempted before its pending token landed: it waits for it
            hits = self.kv.get_computed_blocks(req) if req.params.prompt_logprobs is None else []
            num_hit_tokens = len(hits) * self.kv.block_size
            tail = self.kv.swapped_tail(req, len(hits))  # a preempted request's last block
            num_new = min(req.num_tokens - num_hit_tokens - tail - req.num_computed_tokens, budget)
            if not self.kv.allocate_slots(req, tail + num_new, hits):
                break
            self.waiting.popleft()
            self.kv.resume_tail(req, len(hits), tail)
            req.num_computed_tokens += num_hit_tokens + tail
            if req.num_cached_tokens < 0:  # first scheduled
                req.num_cached_tokens = min(num_hit_tokens, req.num_prompt_tokens)
                self.kv.record_prompt(req.num_prompt_tokens, req.num_cached_tokens)
            if req.timings.first_scheduled is None:
                req.timings.first_scheduled = time.monotonic()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self.kv.cache_computed_blocks(req, req.num_computed_tokens + num_new)
            scheduled.append((req, num_new))
            budget -= num_new

        # Decodes (speculating ones too: a decode row per position) first, and within each
        # kind the requests of one LoRA adapter together (its rows one run: engine/lora),
        # stable otherwise.
        scheduled.sort(key=_layout_key)
        batch.items = scheduled
        self._charge(scheduled)
        return batch

    def _adapter_fits(self, req: Request, adapters: set[LoRARef]) -> bool:
        """Whether `req`'s LoRA adapter (if any) can run in this step beside `adapters`, the
        step's so far (added to them if so): a step holds at most `max_loras`."""
        if req.lora is None or req.lora in adapters:
            return True
        if len(adapters) >= self.config.max_loras:
            return False
        adapters.add(req.lora)
        return True

    def _victim(self, first: int) -> int:
        """Which running request (by position, from `first` on: those not scheduled yet
        this step) gives up its blocks: the lowest priority, the latest admitted."""
        return max(range(first, len(self.running)), key=lambda k: (self.running[k].priority, k))

    def _preempt_for_priority(self, batch: ScheduledBatch, budget: int) -> None:
        """Step 0: running requests the queue's head outranks give up their blocks and slots
        (`_victim` order) until the head fits, or none it outranks is left."""
        head = self.waiting.head()
        if head is None or not any(r.priority > head.priority for r in self.running):
            return
        while self.running:
            hits = self.kv.get_computed_blocks(head) if head.params.prompt_logprobs is None else []
            left = head.num_tokens - head.num_computed_tokens - len(hits) * self.kv.block_size
            room = len(self.running) < self.config.max_num_seqs
            if room and self.kv.can_allocate(head, max(1, min(left, budget)), hits):
                return
            k = self._victim(0)
            if self.running[k].priority <= head.priority:
                return  # nobody it outranks is left
            victim = self.running.pop(k)
            self._preempt(victim)
            batch.preempted.append(victim)

    def _charge(self, scheduled: list[tuple[Request, int]]) -> None:
        """Each tenant's share of this step: its requests' prompt and output tokens."""
        for req, n in scheduled:
            real = n - len(req.draft_token_ids)
            prompt = max(0, min(req.num_prompt_tokens, req.num_computed_tokens + real)
                         - req.num_computed_tokens)  # fmt: skip
            self.fair.charge(req.tenant, prompt, real - prompt)

    def _propose(self, budget: int) -> dict[str, list[int]]:
        """Drafts for every running request about to decode one token (engine/spec), all
        at once (a draft model runs them as one batch)."""
        if self.speculator is None:
            return {}  # no request ever holds drafts
        for req in self.running:
            req.draft_token_ids = []
        decoding = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        return self.speculator.propose(decoding, budget, len(self.running))

    def _drafts(
        self, req: Request, num_new: int, budget: int, proposed: dict[str, list[int]]
    ) -> list[int]:
        """`req`'s proposed drafts, as many as the budget left holds. None unless the free
        blocks hold them with one block to spare per running request: drafts must not push
        a real token out (a preemption)."""
        drafts = proposed.get(req.request_id, [])[: budget - 1] if num_new == 1 else []
        need = self.kv.num_blocks_needed(req, 1 + len(drafts), 0) if drafts else 0
        if need and self.kv.pool.num_free_blocks - need < len(self.running):
            return []
        return drafts

    def _preempt(self, req: Request) -> None:
        req.draft_token_ids = []
        self.kv.preempt(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(req)

    def finish(self, req: Request, keep_blocks: bool = False) -> None:
        """Drop a finished or aborted request from the queues and free its blocks (unless
        `keep_blocks`: a step in flight still writes to them, engine/overlap.py)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if not keep_blocks:
            self.kv.free(req)
        req.status = RequestStatus.FINISHED

    def admit_landed(self, req: Request) -> None:
        """`req`'s prompt KV has landed in its reserved blocks (computed by another engine);
        it joins the running batch on the next step with its first token to compute."""
        req.status = RequestStatus.RUNNING
        self.running.append(req)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def prefill_backlog(self) -> int:
        """Tokens still to compute before their first sample here: the waiting requests'
        and those of running ones part-way through a chunked prefill."""
        running = sum(
            r.num_tokens - r.num_computed_tokens for r in self.running if not r.num_sampled_here
        )
        return running + sum(r.num_tokens - r.num_computed_tokens for r in self.waiting)

    def oldest_unanswered_arrival(self) -> float | None:
        """Arrival time of the oldest request without its first sample here: the head of
        the queue, or a running one part-way through its prompt (a worker that prefills its
        own prompts admits them up to its batch cap, so its queue forms only after TTFT has
        grown). None when there is none."""
        unanswered = [r.arrival_time for r in self.running if not r.num_sampled_here]
        queued = self.waiting.oldest_arrival()
        if queued is not None:
            unanswered.append(queued)
        return min(unanswered, default=None)
