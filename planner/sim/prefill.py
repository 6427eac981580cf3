"""One simulated prefill worker: an LRU prefix cache of `capacity` blocks in front of a FIFO
server whose service times come from a measured profile (core.perf.WorkerProfile).

It answers what a real prefill worker tells the router: KV events for what it stored and
evicted, and load reports with its queued tokens, its cache occupancy and its engine step
totals (core.step_stats), from which the router calibrates its time model online.

Prefix migration: told to pull k blocks from a peer, it copies the blocks that follow its
own cached prefix from the peer's cache, as far as the peer still holds them (its index
entry may be stale), stores them like computed ones, and counts them apart: they are neither
its cache hits nor computed. The peer's copies go to the LRU end of its cache, as a real
peer releases a prefix it handed over. The copy starts when the request arrives, or when the
peer has computed the blocks if a prefill there is still making them, and the prefill starts
once both the copy and the queue ahead are done.

    time --->     arrival        start = max(arrival, busy_until)        finish
    request k        |-------- wait --------|------- prefill_ms(uncached) ------|
                     |<------------------------ TTFT -------------------------->|

A routed request waits in the worker's queue (`submit`: the front door's prefill gate) and
touches the cache only when it starts (`start_next`), as Baton's engine looks a request's
prefix up, allocates its blocks (evicting others) and names them in its prefix cache when it
schedules it: so its hit is what the cache holds then, and its events (blocks stored and
evicted) are reported at its start. A request queued behind it on the same worker hits
those blocks; a peer copying them waits until they are computed (`ready_ms`). (The
synchronous `serve` + `enqueue` do it all at arrival, for callers with no queue of their
own.) Who starts next is the gate's choice (`next_index`, router.cluster.prefill_gate's
`next_in_line`: a longer prefix in the cache than the head's goes first, the head once it
has been passed over `max_skips` times).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Container
from dataclasses import dataclass

import msgspec

from core.events import BlockRemoved, BlockStored, KVEvent, KVEventBatch, WorkerLoad
from core.perf import WorkerProfile, attention_pairs
from core.step_stats import StepTotals
from router.cluster.prefill_gate import LOOKAHEAD, next_in_line


@dataclass(slots=True)
class Job:
    start_ms: float
    finish_ms: float
    tokens: int
    steps: int
    pairs: int
    """Its attention's query-key pairs (core.step_stats.StepTotals.prefill_pairs),"""
    attention_ms: float
    """and the part of its service time they take (the profile's attention term)."""


@dataclass(slots=True)
class Queued:
    """A routed request waiting for its turn on a worker."""

    n: int
    arrival_ms: float
    hashes: list[int]
    length: int
    peer: SimWorker | None
    pull_blocks: int
    estimate: int
    """Tokens it will compute as the worker's cache stood at its arrival (load reports)."""
    skips: int = 0
    """Times a request queued after it started first."""


@dataclass(slots=True)
class Started:
    """What a request's start decided: its reuse, its finish and its events."""

    queued: Queued
    start_ms: float
    finish_ms: float
    hit_tokens: int
    moved_tokens: int
    events: KVEventBatch | None
    """The blocks it stores and those it evicts, reported at its start."""


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


def add_steps(totals: StepTotals, job: Job, steps: int) -> None:
    """Count `steps` of the job's steps (its work split evenly over them) in `totals`."""
    share = steps / job.steps
    totals.steps += steps
    totals.prefill_tokens += round(job.tokens * share)
    totals.prefill_pairs += round(job.pairs * share)
    totals.forward_s += (job.finish_ms - job.start_ms) * share / 1000
    totals.attention_s += job.attention_ms * share / 1000


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
        self.ready_ms: dict[int, float] = {}
        """When each cached block was (or will be) computed, while that is in the future."""
        self.queue: deque[Queued] = deque()

    # -- requests that wait for their turn ---------------------------------------------
    def submit(self, job: Queued) -> None:
        self.queue.append(job)

    def next_start(self) -> float | None:
        """When the first queued request starts (None: none is queued)."""
        return max(self.queue[0].arrival_ms, self.busy_until) if self.queue else None

    def next_index(self, max_skips: int) -> int:
        """Which queued request starts next (its place in the queue), as the gate picks."""
        queue = self.queue
        if len(queue) == 1 or queue[0].skips >= max_skips:
            return 0
        held = [prefix_length(q.hashes, self.cache) for q in itertools.islice(queue, LOOKAHEAD)]
        return next_in_line(held, [True] * len(held), queue[0].skips, max_skips) or 0

    def start_next(self, block_size: int, index: int = 0) -> Started:
        """Start the queued request at `index` (`next_index`): its cache lookup, copy,
        evictions and prefill."""
        start = self.next_start()
        assert start is not None
        q = self.queue[index]
        del self.queue[index]
        for passed in itertools.islice(self.queue, index):
            passed.skips += 1
        hit, pulled, events, available = self.serve(q.hashes, q.peer, q.pull_blocks)
        hit_tokens = min(hit * block_size, q.length)
        moved = min((hit + pulled) * block_size, q.length) - hit_tokens
        finish = self.enqueue(
            q.arrival_ms, q.length, q.length - hit_tokens - moved, moved, available
        )
        self.computed(q.hashes[hit:], finish, start)
        return Started(q, start, finish, hit_tokens, moved, self.batch(events) if events else None)

    # -- the cache ---------------------------------------------------------------------
    def serve(
        self, hashes: list[int], peer: SimWorker | None = None, pull_blocks: int = 0
    ) -> tuple[int, int, list[KVEvent], float]:
        """Look the chain up, copy up to `pull_blocks` more from `peer`, store the rest, evict
        LRU. Returns the hit and the copied blocks, the events (stored, then removed: wrap
        them with `batch`), and when the copied blocks exist on the peer."""
        cache = self.cache
        hit = prefix_length(hashes, cache)
        pulled, available = 0, 0.0
        if peer is not None and pull_blocks > 0:
            pulled = max(0, min(hit + pull_blocks, prefix_length(hashes, peer.cache)) - hit)
            # the peer's copy becomes its first to evict, tail first (prefill_worker.worker:
            # `hand_over`): the prefix moves here rather than doubles
            for h in hashes[hit : hit + pulled]:
                available = max(available, peer.ready_ms.get(h, 0.0))
            for h in hashes[: hit + pulled] if pulled else ():
                peer.cache.move_to_end(h, last=False)
        new = [h for h in hashes[hit:] if h not in cache]
        evicted = store_chain(cache, hashes, self.capacity)
        for h in evicted:
            self.ready_ms.pop(h, None)
        events: list[KVEvent] = []
        if new:
            events.append(BlockStored(hashes[hit - 1] if hit else None, new))
        if evicted:
            events.append(BlockRemoved(evicted))
        return hit, pulled, events, available

    def batch(self, events: list[KVEvent]) -> KVEventBatch:
        """The worker's next event batch (its own sequence numbers)."""
        self.seq += 1
        return KVEventBatch(self.worker_id, self.seq - 1, events, model="m")

    def computed(self, hashes: list[int], finish_ms: float, now_ms: float) -> None:
        """The prefill that stores `hashes` finishes at `finish_ms`; forget blocks long done."""
        ready = self.ready_ms
        if len(ready) > 4 * self.capacity:
            for h in [h for h, t in ready.items() if t <= now_ms]:
                del ready[h]
        for h in hashes:
            if h in self.cache:
                ready[h] = finish_ms

    # -- the queue ---------------------------------------------------------------------
    def enqueue(
        self,
        now_ms: float,
        prompt_tokens: int,
        uncached: int,
        transferred: int = 0,
        available_ms: float = 0.0,
        stretch: float = 1.0,
    ) -> float:
        """Queue a prefill of `uncached` tokens arriving at `now_ms`, `transferred` of the
        others copied from a peer first (from `available_ms` at the earliest); returns its
        finish. `stretch`: how much slower than profiled its steps run (a host whose cores
        are all taken, planner/sim/host.py)."""
        context = prompt_tokens - uncached
        service = self.profile.prefill_ms(uncached, context) * stretch
        attention = self.profile.attention_ms(uncached, context)
        pairs = attention_pairs(uncached, context)
        ready = now_ms
        if transferred:
            ready = max(now_ms, available_ms) + self.profile.transfer_ms(transferred)
        start = max(ready, self.busy_until)
        self.busy_until = start + service
        self.work_ms += service
        steps = self.profile.num_steps(uncached)
        self.jobs.append(Job(start, self.busy_until, uncached, steps, pairs, attention))
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += prompt_tokens - uncached - transferred
        self.transferred_tokens += transferred
        return self.busy_until

    def load(self, now_ms: float) -> WorkerLoad:
        """The report a real worker would send at `now_ms`: finished prefills are in the step
        totals, unfinished ones in the queue (the running one by its remaining part)."""
        totals, done = self.totals, 0
        waiting_tokens = num_waiting = 0
        reported = totals
        for job in self.jobs:
            if job.finish_ms <= now_ms:
                add_steps(totals, job, job.steps)
                done += 1
            elif job.start_ms < now_ms:
                left = (job.finish_ms - now_ms) / (job.finish_ms - job.start_ms)
                waiting_tokens += int(job.tokens * left)
                # an engine's totals count the steps it finished of a prefill still running
                finished = int(job.steps * (1.0 - left))
                if finished:
                    reported = msgspec.structs.replace(totals)
                    add_steps(reported, job, finished)
            else:
                waiting_tokens += job.tokens
                num_waiting += 1
        del self.jobs[:done]  # FIFO: the finished ones are the first
        for q in self.queue:
            waiting_tokens += q.estimate
            num_waiting += 1
        return WorkerLoad(
            self.worker_id,
            "prefill",
            num_running=len(self.jobs) - num_waiting + len(self.queue),
            num_waiting=num_waiting,
            num_waiting_tokens=waiting_tokens,
            num_free_blocks=self.capacity,  # an engine counts evictable cached blocks free
            num_total_blocks=self.capacity,
            timestamp=now_ms / 1000,
            num_prompt_tokens=self.prompt_tokens,
            num_cached_prompt_tokens=self.cached_tokens,
            num_pulled_prompt_tokens=self.transferred_tokens,
            steps=msgspec.structs.replace(reported),
        )
