"""One simulated prefill worker: an LRU prefix cache of `capacity` blocks in front of a FIFO
server whose service times come from a measured profile (bench.sim_profile).

It answers what a real prefill worker tells the router: KV events for what it stored and
evicted, and load reports with its queued tokens, its cache occupancy and its engine step
totals (core.step_stats), from which the router calibrates its time model online.

Prefix migration: told to pull k blocks from a peer, it copies the blocks that follow its
own cached prefix from the peer's cache, as far as the peer still holds them (its index
entry may be stale), stores them like computed ones, and counts them apart: they are neither
its cache hits nor computed. The copy starts when the request arrives (the peer's compute is
not involved) and the prefill starts once both the copy and the queue ahead are done.

    time --->     arrival        start = max(arrival, busy_until)        finish
    request k        |-------- wait --------|------- prefill_ms(uncached) ------|
                     |<------------------------ TTFT -------------------------->|
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass

from bench.sim_profile import WorkerProfile
from core.events import BlockRemoved, BlockStored, KVEventBatch, WorkerLoad
from core.step_stats import StepTotals


@dataclass(slots=True)
class Job:
    start_ms: float
    finish_ms: float
    tokens: int
    steps: int


def prefix_length(hashes: list[int], cache: Container[int]) -> int:
    """How many leading blocks of the chain `cache` holds."""
    n = 0
    for h in hashes:
        if h not in cache:
            break
        n += 1
    return n


def store_chain(cache: OrderedDict[int, None], hashes: list[int], capacity: int) -> list[int]:
    """Put a served prompt's chain in an LRU cache and evict down to `capacity`; returns the
    evicted hashes. The chain is touched tail first, so its own tail is the first of it to
    go: an engine frees a finished request's blocks in reverse order for this reason
    (engine.kv_cache.manager), since a block is only useful while its prefix is cached."""
    for h in reversed(hashes):
        cache[h] = None
        cache.move_to_end(h)
    evicted = []
    while len(cache) > capacity:
        evicted.append(cache.popitem(last=False)[0])
    return evicted


class SimWorker:
    def __init__(self, worker_id: str, capacity: int, profile: WorkerProfile) -> None:
        self.worker_id = worker_id
        self.capacity = capacity
        self.profile = profile
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.busy_until = 0.0
        self.work_ms = 0.0
        self.jobs: list[Job] = []  # not yet counted in `totals`, in start order
        self.totals = StepTotals()
        self.prompt_tokens = self.cached_tokens = self.transferred_tokens = 0
        self.seq = 0

    # -- the cache ---------------------------------------------------------------------
    def serve(
        self, hashes: list[int], peer: SimWorker | None = None, pull_blocks: int = 0
    ) -> tuple[int, int, KVEventBatch]:
        """Look the chain up, copy up to `pull_blocks` more from `peer`, store the rest, evict
        LRU. Returns the hit and the copied blocks, and the events to publish."""
        cache = self.cache
        hit = prefix_length(hashes, cache)
        pulled = 0
        if peer is not None and pull_blocks > 0:
            pulled = max(0, min(hit + pull_blocks, prefix_length(hashes, peer.cache)) - hit)
            for h in reversed(hashes[hit : hit + pulled]):  # read: recently used there too
                peer.cache.move_to_end(h)
        new = [h for h in hashes[hit:] if h not in cache]
        evicted = store_chain(cache, hashes, self.capacity)
        events: list = [BlockStored(hashes[hit - 1] if hit else None, new)] if new else []
        if evicted:
            events.append(BlockRemoved(evicted))
        batch = KVEventBatch(self.worker_id, self.seq, events, model="m")
        self.seq += 1
        return hit, pulled, batch

    # -- the queue ---------------------------------------------------------------------
    def enqueue(
        self, now_ms: float, prompt_tokens: int, uncached: int, transferred: int = 0
    ) -> float:
        """Queue a prefill of `uncached` tokens arriving at `now_ms`, `transferred` of the
        others copied from a peer first; returns its finish."""
        service = self.profile.prefill_ms(uncached, prompt_tokens - uncached)
        ready = now_ms + (self.profile.transfer_ms(transferred) if transferred else 0.0)
        start = max(ready, self.busy_until)
        self.busy_until = start + service
        self.work_ms += service
        self.jobs.append(Job(start, self.busy_until, uncached, self.profile.num_steps(uncached)))
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += prompt_tokens - uncached - transferred
        self.transferred_tokens += transferred
        return self.busy_until

    def load(self, now_ms: float) -> WorkerLoad:
        """The report a real worker would send at `now_ms`: finished prefills are in the step
        totals, unfinished ones in the queue (the running one by its remaining part)."""
        totals, done = self.totals, 0
        waiting_tokens = num_waiting = 0
        for job in self.jobs:
            if job.finish_ms <= now_ms:
                totals.steps += job.steps
                totals.prefill_tokens += job.tokens
                totals.forward_s += (job.finish_ms - job.start_ms) / 1000
                done += 1
            elif job.start_ms < now_ms:
                left = (job.finish_ms - now_ms) / (job.finish_ms - job.start_ms)
                waiting_tokens += int(job.tokens * left)
            else:
                waiting_tokens += job.tokens
                num_waiting += 1
        del self.jobs[:done]  # FIFO: the finished ones are the first
        return WorkerLoad(
            self.worker_id,
            "prefill",
            num_running=len(self.jobs) - num_waiting,
            num_waiting=num_waiting,
            num_waiting_tokens=waiting_tokens,
            num_free_blocks=self.capacity,  # an engine counts evictable cached blocks free
            num_total_blocks=self.capacity,
            timestamp=now_ms / 1000,
            num_prompt_tokens=self.prompt_tokens,
            num_cached_prompt_tokens=self.cached_tokens,
            num_pulled_prompt_tokens=self.transferred_tokens,
            steps=StepTotals(
                steps=totals.steps,
                prefill_tokens=totals.prefill_tokens,
                forward_s=totals.forward_s,
            ),
        )
