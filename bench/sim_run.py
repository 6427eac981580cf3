"""One trace through routers into simulated prefill workers, and the pooled-LRU oracle.

Per request, in arrival order (`simulate`):
  1. prefills finished by now tell the router (Ticket.prefill_done, then close);
  2. every `report_every` requests each worker sends the load report a real one would
     (bench.sim_worker: queued tokens, capacity, step totals, prompt / cached tokens);
  3. the router picks a prefill worker (one decode worker exists so decisions are complete;
     conditional disaggregation is off: every prompt is prefilled in the prefill pool);
  4. that worker's cache answers with its true longest prefix, copies the blocks the
     decision pulls from a peer (as far as the peer still holds them), stores the rest,
     evicts LRU and publishes the events; its FIFO queue gives the request's TTFT.

Reuse is counted two ways: cache hits (the worker's own cache) and tokens transferred from
a peer; computed tokens are the rest. The oracle compares with both together (`reuse_rate`):
a pooled cache is what migration makes of the workers' caches.

The oracle is one LRU cache of all workers' capacity seeing every request: what any
placement could reuse at most (computed tokens it cannot go below), with no queue model.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Any

from bench.sim_misses import MissLedger
from bench.sim_profile import WorkerProfile
from bench.sim_worker import SimWorker, store_chain
from bench.workloads import TraceRequest
from router.routing.router import Router
from router.routing.ticket import Ticket


def pooled_lru_oracle(trace: list[TraceRequest], capacity: int, block_size: int) -> dict:
    cache: OrderedDict[int, None] = OrderedDict()
    cached = total = 0
    for r in trace:
        hit = 0
        for h in r["hash_ids"]:
            if h not in cache:
                break
            hit += 1
        store_chain(cache, r["hash_ids"], capacity)
        cached += min(hit * block_size, r["input_length"])
        total += r["input_length"]
    return {"hit_rate": cached / total, "computed_tokens": total - cached}


def at_load(
    trace: list[TraceRequest], profile: WorkerProfile, num_workers: int, load: float
) -> list[TraceRequest]:
    """The trace with its clock stretched so that computing every prompt in full would keep
    the pool `load` busy (0: the trace's own clock). Order, and so every cache, is kept."""
    if load <= 0 or len(trace) < 2:
        return trace
    t0 = trace[0]["timestamp"]
    span = trace[-1]["timestamp"] - t0
    work = sum(profile.prefill_ms(r["input_length"]) for r in trace)
    scale = work / (num_workers * load * span) if span > 0 else 1.0
    return [{**r, "timestamp": (r["timestamp"] - t0) * scale} for r in trace]  # type: ignore[misc]


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
    sync_every: int = 8,
) -> dict[str, Any]:
    workers = [SimWorker(f"p{i}", capacity, profile) for i in range(num_workers)]
    by_id = {w.worker_id: w for w in workers}
    done: list[tuple[float, int, Ticket]] = []  # (finish ms, arrival order, its ticket)
    ttfts: list[float] = []
    cached_tokens = transferred_tokens = prompt_tokens = num_pulls = 0
    for n, r in enumerate(trace):
        now = float(r["timestamp"])
        while done and done[0][0] <= now:
            ticket = heapq.heappop(done)[2]
            ticket.prefill_done()
            ticket.close()
        if n % report_every == 0:
            for w in workers:
                load = w.load(now)
                for router in routers:
                    router.report_load(load)
        if len(routers) > 1 and n % sync_every == 0:
            for router in routers:
                router.store.sync(10)
        ticket = routers[n % len(routers)].route(
            "m", block_hashes=r["hash_ids"], num_prompt_tokens=r["input_length"], request_id=f"q{n}"
        )
        ticket.admit()  # no gate here: the simulated worker queues it
        decision = ticket.decision
        w = by_id[decision.prefill_worker_id or ""]
        if misses is not None:
            misses.observe(r, w, workers, now, decision.pulled_blocks)
        peer = by_id[decision.pull_from.peer_id] if decision.pull_from is not None else None
        hit, pulled, batch = w.serve(r["hash_ids"], peer, decision.pulled_blocks)
        routers[int(w.worker_id[1:]) % len(routers)].apply(batch)
        length = r["input_length"]
        hit_tokens = min(hit * block_size, length)
        moved = min((hit + pulled) * block_size, length) - hit_tokens
        finish = w.enqueue(now, length, length - hit_tokens - moved, moved)
        ttfts.append(finish - now)
        heapq.heappush(done, (finish, n, ticket))
        cached_tokens += hit_tokens
        transferred_tokens += moved
        num_pulls += 1 if moved else 0
        prompt_tokens += length
    for _, _, ticket in done:
        ticket.close()
    work = [w.work_ms for w in workers]
    mean = sum(work) / len(work)
    return {
        "computed_tokens": prompt_tokens - cached_tokens - transferred_tokens,
        "hit_rate": cached_tokens / prompt_tokens,
        "transfer_rate": transferred_tokens / prompt_tokens,
        "reuse_rate": (cached_tokens + transferred_tokens) / prompt_tokens,
        "transferred_tokens": transferred_tokens,
        "num_pulls": num_pulls,
        "load_max_over_mean": max(work) / mean if mean else 1.0,
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p99_ms": percentile(ttfts, 0.99),
        "makespan_ms": max(w.busy_until for w in workers),
    }
