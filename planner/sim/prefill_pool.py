"""One trace through routers into simulated prefill workers, and the pooled-LRU oracle.

Per request, in arrival order (`simulate`):
  1. prefills finished by now tell the router (Ticket.prefill_done, then close);
  2. every `report_every` requests each worker sends the load report a real one would
     (planner.sim.prefill: queued tokens, capacity, step totals, prompt / cached tokens);
  3. the router picks a prefill worker (one decode worker exists so decisions are complete;
     conditional disaggregation is off: every prompt is prefilled in the prefill pool);
  4. the request waits in that worker's FIFO queue; when it starts, the worker's cache
     answers with its longest prefix, copies the blocks the decision pulls from a peer (as
     far as the peer still holds them), stores the rest and evicts LRU (planner.sim.prefill);
  5. the worker's KV events reach the router through the replica that owns the worker when
     the request starts (an engine names a request's blocks in its cache when it schedules
     it). Until then the router knows them only as its decision's promise
     (router/routing/index/pending.py), which other replicas read at their next sync.

Router replicas (several routers, one Redis) sync every `sync_ms` of simulated time: each
then reads every decision, charge (router/routing/load_share.py) and event published before,
so a replica routes on a view up to `sync_ms` old. REPLICA_SYNC_MS comes from the
propagation `python -m bench.routing.replica_sync` measured between two replicas here (a promise
published by one, seen in the other's index).

Reuse is counted two ways: cache hits (the worker's own cache) and tokens transferred from
a peer; computed tokens are the rest. The oracle compares with both together (`reuse_rate`):
a pooled cache is what migration makes of the workers' caches.

The oracle is one LRU cache of all workers' capacity seeing every request: what any
placement could reuse at most (computed tokens it cannot go below), with no queue model.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from dataclasses import replace
from typing import Any

from core.events import KVEventBatch
from core.perf import WorkerProfile
from loadgen.traces import TraceRequest
from planner.sim.misses import MissLedger
from planner.sim.prefill import Queued, SimWorker, prefix_length, store_chain
from router.routing.route import Router
from router.routing.ticket import Ticket

REPLICA_SYNC_MS = 20.0
"""Replicas sync this often, so a view is 0 to 20 ms old, 10 on average: within what
`python -m bench.routing.replica_sync` measured here (p50 5.7-7.4 ms with both cores busy, 15.7
idle; p99 15-53; docs/performance.md, where 30 ms changes one workload by 1.3%)."""


def pooled_lru_oracle(trace: list[TraceRequest], capacity: int, block_size: int) -> dict:
    cache: OrderedDict[int, None] = OrderedDict()
    cached = total = 0
    for r in trace:
        hit = 0
        for h in r.hash_ids:
            if h not in cache:
                break
            hit += 1
        store_chain(cache, r.hash_ids, capacity)
        cached += min(hit * block_size, r.input_length)
        total += r.input_length
    return {"hit_rate": cached / total, "computed_tokens": total - cached}


def at_load(
    trace: list[TraceRequest],
    profile: WorkerProfile,
    num_workers: int,
    load: float,
    peak: bool = False,
) -> list[TraceRequest]:
    """The trace with its clock stretched so that computing every prompt in full would keep
    the pool `load` busy (0: the trace's own clock) over the whole trace, or, with `peak`,
    over its busiest tenth (`busiest_rate`). Order, and so every cache, is kept."""
    if load <= 0 or len(trace) < 2:
        return trace
    t0 = trace[0].arrival_ms
    span = trace[-1].arrival_ms - t0
    if span <= 0:
        return trace
    work = [profile.prefill_ms(r.input_length) for r in trace]
    rate = busiest_rate(trace, work) if peak else sum(work) / span
    scale = rate / (num_workers * load)
    return [replace(r, arrival_ms=(r.arrival_ms - t0) * scale) for r in trace]


def busiest_rate(trace: list[TraceRequest], work: list[float], parts: int = 10) -> float:
    """Work (ms) a trace ms brings in the busiest of `parts` runs of equally many requests,
    each request's over the time until the next one arrives (Mooncake's synthetic trace:
    1.87x its average, its prompts growing from ~11k to ~22k tokens along it). A trace too
    short to split: its average."""
    n = len(trace)
    span = trace[-1].arrival_ms - trace[0].arrival_ms
    best = sum(work) / span
    if n < 2 * parts:
        return best
    for i in range(parts):
        a, b = i * n // parts, min((i + 1) * n // parts, n - 1)
        part_span = trace[b].arrival_ms - trace[a].arrival_ms
        if part_span > 0:
            best = max(best, sum(work[a:b]) / part_span)
    return best


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def simulate(
    trace: list[TraceRequest],
    routers: list[Router],
    num_workers: int,
    capacity: int,
    block_size: int,
    profile: WorkerProfile,
    misses: MissLedger | None = None,
    report_every: int = 8,
    sync_ms: float = REPLICA_SYNC_MS,
    late_binding: bool = False,
) -> dict[str, Any]:
    workers = [SimWorker(f"p{i}", capacity, profile) for i in range(num_workers)]
    max_skips = routers[0].config.gate_max_skips  # the front door's gate, as configured
    by_id = {w.worker_id: w for w in workers}
    tickets: dict[int, Ticket] = {}
    # what happens later, in time order (ties: in the order it was scheduled)
    events: list[tuple[float, int, KVEventBatch]] = []  # a worker's events reach its router
    done: list[tuple[float, int, int]] = []  # (finish ms, tie-break, request): prefill done
    order = itertools.count()
    clock = [0.0]  # the routers' promises expire on the simulated clock (seconds)
    for router in routers:
        router.use_clock(lambda: clock[0])
    ttfts: list[float] = []
    stats = {"cached": 0, "moved": 0, "prompt": 0, "pulls": 0, "bound_late": 0}
    central: deque[int] = deque()  # late binding: arrived, not routed yet

    def dispatch(n: int, now: float) -> None:
        """Route request n at `now` and queue it on its prefill worker."""
        r = trace[n]
        ticket = routers[n % len(routers)].route(
            "m", block_hashes=r.hash_ids, num_prompt_tokens=r.input_length, request_id=f"q{n}"
        )
        ticket.admit()  # no gate here: the simulated worker queues it
        decision = ticket.decision
        w = by_id[decision.prefill_worker_id or ""]
        peer = by_id[decision.pull_from.peer_id] if decision.pull_from is not None else None
        length = r.input_length
        estimate = length - min(prefix_length(r.hash_ids, w.cache) * block_size, length)
        w.submit(Queued(n, now, r.hash_ids, length, peer, decision.pulled_blocks, estimate))
        tickets[n] = ticket
        stats["prompt"] += length

    def bind(now: float) -> None:
        """Late binding: route the oldest arrivals while some worker has nothing waiting."""
        while central and any(not w.queue for w in workers):
            dispatch(central.popleft(), now)

    synced_at = [-math.inf]

    def sync(now: float) -> None:
        """Replicas read each other every `sync_ms` of simulated time, between arrivals
        too (late binding routes there)."""
        if len(routers) > 1 and now - synced_at[0] >= sync_ms:
            for router in routers:
                router.store.sync(10)
            synced_at[0] = now

    def run_until(t: float) -> None:
        """Everything up to `t`: events reach the routers, prefills finish, queued requests
        start (in that order at equal times)."""
        while True:
            starts = [(w.next_start(), i) for i, w in enumerate(workers) if w.queue]
            start = min(starts) if starts else None
            t_event = events[0][0] if events else math.inf
            t_done = done[0][0] if done else math.inf
            t0 = min(t_event, t_done, start[0] if start else math.inf)
            if t0 > t or t0 == math.inf:
                return
            clock[0] = t0 / 1000
            sync(t0)
            if t_event == t0:
                batch = heapq.heappop(events)[2]
                routers[int(batch.worker_id[1:]) % len(routers)].apply(batch)
            elif t_done == t0:
                ticket = tickets.pop(heapq.heappop(done)[2])
                ticket.prefill_done()
                ticket.close()
            else:
                assert start is not None
                w = workers[start[1]]
                index = w.next_index(max_skips)
                q = w.queue[index]
                if misses is not None:
                    misses.observe(trace[q.n], w, workers, t0, q.pull_blocks)
                s = w.start_next(block_size, index)
                if s.events is not None:
                    heapq.heappush(events, (t0, next(order), s.events))
                heapq.heappush(done, (s.finish_ms, next(order), q.n))
                ttfts.append(s.finish_ms - float(trace[q.n].arrival_ms))
                stats["cached"] += s.hit_tokens
                stats["moved"] += s.moved_tokens
                stats["pulls"] += 1 if s.moved_tokens else 0
            if late_binding:
                bind(t0)

    for n, r in enumerate(trace):
        now = float(r.arrival_ms)
        run_until(now)
        clock[0] = now / 1000
        if n % report_every == 0:
            for w in workers:
                load = w.load(now)
                for router in routers:
                    router.report_load(load)
        sync(now)
        if late_binding:
            central.append(n)
            bind(now)
            stats["bound_late"] += 1 if central else 0
        else:
            dispatch(n, now)
        run_until(now)  # an idle worker starts it at once
    run_until(math.inf)
    cached_tokens, transferred_tokens = stats["cached"], stats["moved"]
    prompt_tokens = stats["prompt"]
    num_pulls = stats["pulls"]
    work = [w.work_ms for w in workers]
    mean = sum(work) / len(work)
    return {
        "computed_tokens": prompt_tokens - cached_tokens - transferred_tokens,
        "hit_rate": cached_tokens / prompt_tokens,
        "transfer_rate": transferred_tokens / prompt_tokens,
        "reuse_rate": (cached_tokens + transferred_tokens) / prompt_tokens,
        "transferred_tokens": transferred_tokens,
        "num_pulls": num_pulls,
        "num_bound_late": stats["bound_late"],
        "load_max_over_mean": max(work) / mean if mean else 1.0,
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p99_ms": percentile(ttfts, 0.99),
        "makespan_ms": max(w.busy_until for w in workers),
    }
