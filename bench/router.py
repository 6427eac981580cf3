"""Router micro-benchmark: decision latency and event ingestion on one core.

    python -m bench.router [--blocks 1000000] [--decisions 20000] [--out bench/results/router.json]

For W in (8, 64, 512) workers (W prefill + 8 decode), index `blocks` blocks: chains of 64
blocks in families that share their first 32 blocks, each chain stored on one prefill worker
(ingestion rate = blocks applied / s through Router.apply, in-process store). Then route
prompts of 64 blocks that reuse a random indexed chain up to a random depth and continue
with new blocks (Router.route with block hashes, then request_done so in-flight state stays
bounded) and report p50/p99 per decision and decisions/s. A second run routes 1,024 token
ids at 64 workers, i.e. including the core.hashing cost of 64 blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

from core.events import BlockStored, KVEventBatch
from router.routing import Router, RouterConfig

CHAIN = 64


def build(num_workers: int, num_blocks: int, rng: random.Random) -> tuple[Router, list, dict]:
    router = Router(RouterConfig(disagg_min_uncached_tokens=0))
    for w in range(num_workers):
        router.add_worker(f"p{w}", "prefill", "m")
    for d in range(8):
        router.add_worker(f"d{d}", "decode", "m")
    chains = []
    families = [[rng.getrandbits(63) for _ in range(CHAIN // 2)] for _ in range(num_blocks // 640)]
    seqs = [0] * num_workers
    batches = []
    stored = 0
    while stored < num_blocks:
        fam = rng.choice(families)
        chain = fam + [rng.getrandbits(63) for _ in range(CHAIN // 2)]
        w = len(chains) % num_workers
        chains.append(chain)
        # The family head is new to a worker only once, as a real cache would store it.
        batches.append(KVEventBatch(f"p{w}", seqs[w], [BlockStored(None, chain)], model="m"))
        seqs[w] += 1
        stored += CHAIN
    t0 = time.perf_counter()
    for b in batches:
        router.apply(b)
    dt = time.perf_counter() - t0
    with router.store.read("m") as index:
        entries, hashes = index.num_entries, index.num_hashes
    ingest = {
        "batches": len(batches),
        "blocks_applied": stored,
        "seconds": dt,
        "blocks_per_s": stored / dt,
        "batches_per_s": len(batches) / dt,
        "index_entries": entries,
        "index_distinct_hashes": hashes,
    }
    return router, chains, ingest


def measure(router: Router, prompts: list, as_tokens: bool) -> dict:
    lat = []
    t_all = time.perf_counter()
    for i, p in enumerate(prompts):
        rid = f"r{i}"
        t0 = time.perf_counter_ns()
        if as_tokens:
            router.route("m", p, request_id=rid)
        else:
            router.route("m", block_hashes=p, request_id=rid)
        lat.append(time.perf_counter_ns() - t0)
        router.request_done(rid)
    total = time.perf_counter() - t_all
    lat.sort()
    return {
        "decisions": len(prompts),
        "p50_us": lat[len(lat) // 2] / 1000,
        "p99_us": lat[int(len(lat) * 0.99)] / 1000,
        "mean_us": statistics.fmean(lat) / 1000,
        "decisions_per_s": len(prompts) / total,
        "decisions_per_s_route_only": len(prompts) / (sum(lat) / 1e9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--out", default="bench/results/router.json")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    results = {"host": platform.node(), "python": platform.python_version(), "runs": []}
    for num_workers in args.workers:
        rng = random.Random(num_workers)
        router, chains, ingest = build(num_workers, args.blocks, rng)
        prompts = []
        for _ in range(args.decisions):
            chain = rng.choice(chains)
            depth = rng.randint(0, CHAIN)
            prompts.append(chain[:depth] + [rng.getrandbits(63) for _ in range(CHAIN - depth)])
        run = {
            "workers": num_workers,
            "ingest": ingest,
            "route_hashes": measure(router, prompts, False),
        }
        if num_workers == 64:
            toks = [[rng.randrange(32000) for _ in range(CHAIN * 16)] for _ in range(2000)]
            run["route_token_ids_1024"] = measure(router, toks, True)
        results["runs"].append(run)
        print(json.dumps(run, indent=1))
        del router, chains
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
