"""Trace replay through the router into simulated prefill workers (no model).

    python -m bench.router_sim [--workers 8] [--capacity 600] [--redis] [--out ...]

Each simulated worker is an LRU cache of `capacity` blocks plus a FIFO queue whose service
time is  a + b * uncached_tokens  (ms). Per request, in arrival order:
  1. finished prefills are reported (Router.prefill_done) and, every `report_every`
     requests, each worker's true backlog is sent as a WorkerLoad;
  2. the router picks a prefill worker (one decode worker exists so decisions are complete;
     conditional disaggregation is off, every prompt is prefilled in the prefill pool);
  3. the worker's cache answers with its true longest prefix (the hit), touches it, stores
     the new blocks, evicts LRU blocks, and publishes stored/removed events to the router.
Prefix hit rate = cached prompt tokens / prompt tokens. Load spread = max / mean of the
prefill work (service ms) each worker received. The oracle is one LRU cache pooling all
workers' capacity (N x capacity) and seeing every request: an upper bound on the hit rate of
any placement. With --redis, 4 router replicas share a real redis-server (started here on
127.0.0.1 and stopped by PID): requests go round robin over the replicas, each worker's
events are published through one replica, and replicas catch up every `sync_every` requests.
"""

from __future__ import annotations

import argparse
import heapq
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

from bench.workloads import DEFAULT_TRACE, TraceRequest, multi_turn, read_jsonl, shared_prefix
from core.events import BlockRemoved, BlockStored, KVEventBatch, WorkerLoad
from router.routing.router import Router, RouterConfig
from router.routing.ticket import Ticket


class SimWorker:
    def __init__(self, worker_id: str, capacity: int) -> None:
        self.worker_id = worker_id
        self.capacity = capacity
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.busy_until = 0.0
        self.work_ms = 0.0
        self.seq = 0
        self.backlog: list[tuple[float, int]] = []  # (finish ms, uncached tokens)

    def serve(self, hashes: list[int]) -> tuple[int, KVEventBatch]:
        hit = 0
        for h in hashes:
            if h not in self.cache:
                break
            hit += 1
        for h in hashes[:hit]:
            self.cache.move_to_end(h)
        new = [h for h in hashes[hit:] if h not in self.cache]
        for h in new:
            self.cache[h] = None
        evicted = []
        while len(self.cache) > self.capacity:
            evicted.append(self.cache.popitem(last=False)[0])
        events = [BlockStored(hashes[hit - 1] if hit else None, new)] if new else []
        if evicted:
            events.append(BlockRemoved(evicted))
        batch = KVEventBatch(self.worker_id, self.seq, events, model="m")
        self.seq += 1
        return hit, batch


def oracle_hit_rate(trace: list[TraceRequest], capacity: int, block_size: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    cached = total = 0
    for r in trace:
        hit = 0
        for h in r["hash_ids"]:
            if h not in cache:
                break
            hit += 1
        for h in r["hash_ids"]:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > capacity:
            cache.popitem(last=False)
        cached += min(hit * block_size, r["input_length"])
        total += r["input_length"]
    return cached / total


def simulate(
    trace: list[TraceRequest],
    routers: list[Router],
    num_workers: int,
    capacity: int,
    block_size: int,
    service_a_ms: float = 2.0,
    service_b_ms: float = 0.01,
    report_every: int = 16,
    sync_every: int = 8,
) -> dict:
    workers = [SimWorker(f"p{i}", capacity) for i in range(num_workers)]
    by_id = {w.worker_id: w for w in workers}
    done: list[tuple[float, int, Ticket]] = []  # (finish ms, arrival order, its ticket)
    cached_tokens = prompt_tokens = 0
    for n, r in enumerate(trace):
        now = float(r["timestamp"])
        while done and done[0][0] <= now:
            heapq.heappop(done)[2].close()
        if n % report_every == 0:
            for w in workers:
                w.backlog = [(f, t) for f, t in w.backlog if f > now]
                load = WorkerLoad(
                    w.worker_id, "prefill", 0, len(w.backlog), sum(t for _, t in w.backlog), 0, 0
                )
                for router in routers:
                    router.report_load(load)
        if len(routers) > 1 and n % sync_every == 0:
            for router in routers:
                router.store.sync(10)
        ri = n % len(routers)
        rid = f"q{n}"
        ticket = routers[ri].route(
            "m", block_hashes=r["hash_ids"], num_prompt_tokens=r["input_length"], request_id=rid
        )
        ticket.admit()  # no gate here: the simulated worker queues it (its backlog)
        decision = ticket.decision
        w = by_id[decision.prefill_worker_id or ""]
        hit, batch = w.serve(r["hash_ids"])
        routers[int(w.worker_id[1:]) % len(routers)].apply(batch)
        hit_tokens = min(hit * block_size, r["input_length"])
        uncached = r["input_length"] - hit_tokens
        service = service_a_ms + service_b_ms * uncached
        w.busy_until = max(now, w.busy_until) + service
        w.work_ms += service
        w.backlog.append((w.busy_until, uncached))
        heapq.heappush(done, (w.busy_until, n, ticket))
        cached_tokens += hit_tokens
        prompt_tokens += r["input_length"]
    work = [w.work_ms for w in workers]
    mean = sum(work) / len(work)
    return {
        "hit_rate": cached_tokens / prompt_tokens,
        "load_max_over_mean": max(work) / mean if mean else 1.0,
        "makespan_ms": max(w.busy_until for w in workers),
    }


def make_routers(policy: str, num_workers: int, replicas: int, redis_url: str | None, ns: str):
    routers = []
    for _ in range(replicas):
        store = None
        if redis_url:
            from router.routing.index.redis_store import RedisStore

            store = RedisStore(url=redis_url, namespace=ns, poll_ms=5)
        cfg = RouterConfig(prefill_policy=policy, disagg_min_uncached_tokens=0)
        router = Router(cfg, store=store)
        for i in range(num_workers):
            router.add_worker(f"p{i}", "prefill", "m")
        router.add_worker("d0", "decode", "m")
        routers.append(router)
    return routers


def start_redis(workdir: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    return proc, f"redis://127.0.0.1:{port}/0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--capacity", type=int, default=200, help="blocks per worker")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--redis", action="store_true", help="also run 4 replicas on Redis")
    parser.add_argument("--trace", default=str(DEFAULT_TRACE["mooncake"]),
                        help="a Mooncake-format JSONL trace")  # fmt: skip
    parser.add_argument("--out", default="bench/results/router_sim.json")
    args = parser.parse_args()
    workloads = {
        "shared_prefix": (shared_prefix(num_requests=args.requests, rate_per_s=1500), 16),
        "multi_turn": (multi_turn(num_sessions=args.requests // 5, rate_per_s=40), 16),
    }
    if Path(args.trace).exists():
        workloads["mooncake_synthetic"] = (read_jsonl(args.trace, args.requests), 512)
    else:
        print(f"no trace at {args.trace}: the mooncake run is skipped (--trace PATH)")
    results: dict = {"workers": args.workers, "capacity_blocks": args.capacity, "runs": {}}
    for name, (trace, block) in workloads.items():
        cap = args.capacity if block == 16 else max(8, args.capacity // 4)
        res: dict = {"oracle_pooled_lru": oracle_hit_rate(trace, cap * args.workers, block)}
        for policy in ("cache_aware", "least_loaded", "round_robin", "random"):
            routers = make_routers(policy, args.workers, 1, None, "")
            res[policy] = simulate(trace, routers, args.workers, cap, block)
        if args.redis:
            tmp = tempfile.mkdtemp()
            proc, url = start_redis(tmp)
            try:
                routers = make_routers("cache_aware", args.workers, 4, url, f"sim:{name}")
                for r in routers:
                    r.store.sync(10)
                res["cache_aware_4_replicas_redis"] = simulate(
                    trace, routers, args.workers, cap, block
                )
                for r in routers:
                    r.close()
            finally:
                proc.kill()
                proc.wait(timeout=10)
                shutil.rmtree(tmp, ignore_errors=True)
        results["runs"][name] = res
        print(name, json.dumps(res, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
