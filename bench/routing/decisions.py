"""Router micro-benchmark: decision latency and event ingestion on one core.

    python -m bench.routing.decisions [--blocks 1000000] [--repeats 3] [--baseline DIR] [--cpu 1]

For W in (8, 64, 512) workers (W prefill + 8 decode), index `blocks` blocks: chains of 64
blocks in families that share their first 32 blocks, each chain stored on one prefill worker
(ingestion rate = blocks applied / s through Router.apply, in-process store). Then:

  route_hashes   prompts of 64 blocks that reuse a random indexed chain up to a random depth
                 and continue with new blocks: Router.route(block_hashes=...), then
                 closes its ticket (so in-flight state stays bounded). The front door hashes a
                 prompt once, so this is the decision cost proper.
  route_tokens   the same with 1,024 token ids: includes core.hashing of 64 blocks.
  hash_only      core.hashing.hash_prompt_blocks of those 1,024 tokens alone.

p50 / p99 are wall-clock per decision (route only); cpu_p50 / cpu_p99 the same in thread CPU
time, which a busy shared machine does not inflate by preempting us; decisions_per_s (and
_per_cpu_s) count the whole loop (route + closing the ticket). The first `--warmup` decisions of
each kind are not counted.

The machine is shared and noisy, so each (code tree, W) is measured `--repeats` times in a
fresh process pinned to one core, runs interleaved, and the summary gives the best and the
median. `--baseline DIR` also measures the `router` package of another tree (e.g. a copy of
the code before a change) with this same script, in the same interleaved schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.paths import results_file

CHAIN = 64
TOKENS_PER_PROMPT = CHAIN * 16


def build(num_workers: int, num_blocks: int, rng: random.Random) -> tuple[Any, list, dict]:
    from core.events import BlockStored, KVEventBatch
    from router.routing.route import Router, RouterConfig

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
        "blocks_applied": stored,
        "blocks_per_s": stored / dt,
        "batches_per_s": len(batches) / dt,
        "index_entries": entries,
        "index_distinct_hashes": hashes,
    }
    return router, chains, ingest


def _percentiles(lat_ns: list[int], prefix: str = "") -> dict[str, float]:
    lat_ns.sort()
    return {
        f"{prefix}p50_us": lat_ns[len(lat_ns) // 2] / 1000,
        f"{prefix}p99_us": lat_ns[int(len(lat_ns) * 0.99)] / 1000,
        f"{prefix}mean_us": statistics.fmean(lat_ns) / 1000,
    }


def measure(router: Any, prompts: list, as_tokens: bool, warmup: int) -> dict[str, float]:
    """Wall-clock latency per decision, and the thread's CPU time per decision (immune to the
    preemption a shared machine adds to wall p99; it includes ~1 µs of clock reads)."""
    route = router.route
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    lat: list[int] = []
    cpu_lat: list[int] = []
    t_all = cpu_all = 0
    for i, p in enumerate(prompts):
        if i == warmup:
            lat.clear()
            cpu_lat.clear()
            t_all, cpu_all = wall(), cpu()
        rid = f"r{i}"
        c0 = cpu()
        t0 = wall()
        if as_tokens:
            ticket = route("m", p, request_id=rid)
        else:
            ticket = route("m", block_hashes=p, request_id=rid)
        t1 = wall()
        cpu_lat.append(cpu() - c0)
        lat.append(t1 - t0)
        ticket.close()
    t_all, cpu_all = wall() - t_all, cpu() - cpu_all
    return {
        "decisions": len(lat),
        **_percentiles(lat),
        "decisions_per_s": len(lat) / t_all * 1e9,
        **_percentiles(cpu_lat, "cpu_"),
        "decisions_per_cpu_s": len(lat) / cpu_all * 1e9,
    }


def measure_hashing(prompts: list) -> dict[str, float]:
    from core.hashing import hash_prompt_blocks, model_root_hash

    root, clock = model_root_hash("m", 16), time.perf_counter_ns
    lat = []
    for p in prompts:
        t0 = clock()
        hash_prompt_blocks(p, 16, root)
        lat.append(clock() - t0)
    return _percentiles(lat)


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement of one W in this process (the parent starts one per run)."""
    if args.code:
        sys.path.insert(0, str(Path(args.code).resolve()))  # measure that tree's `router`
    num_workers = args.workers[0]
    rng = random.Random(num_workers)
    router, chains, ingest = build(num_workers, args.blocks, rng)
    prompts = []
    for _ in range(args.warmup + args.decisions):
        chain = rng.choice(chains)
        depth = rng.randint(0, CHAIN)
        prompts.append(chain[:depth] + [rng.getrandbits(63) for _ in range(CHAIN - depth)])
    toks = [
        [rng.getrandbits(15) for _ in range(TOKENS_PER_PROMPT)]
        for _ in range(args.warmup + args.token_decisions)
    ]
    import router as router_pkg

    return {
        "workers": num_workers,
        "router_package": str(Path(router_pkg.__file__).parent),
        "ingest": ingest,
        "route_hashes": measure(router, prompts, False, args.warmup),
        "route_tokens": measure(router, toks, True, args.warmup),
        "hash_only": measure_hashing(toks[args.warmup :]),
    }


# (section, metric, smaller is better) summarised over repeats
METRICS = [
    ("route_hashes", "p50_us", True),
    ("route_hashes", "p99_us", True),
    ("route_hashes", "mean_us", True),
    ("route_hashes", "decisions_per_s", False),
    ("route_hashes", "cpu_p50_us", True),
    ("route_hashes", "cpu_p99_us", True),
    ("route_hashes", "decisions_per_cpu_s", False),
    ("route_tokens", "p50_us", True),
    ("route_tokens", "p99_us", True),
    ("route_tokens", "decisions_per_s", False),
    ("route_tokens", "decisions_per_cpu_s", False),
    ("hash_only", "p50_us", True),
    ("ingest", "blocks_per_s", False),
]


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for section, metric, smaller in METRICS:
        values = [r[section][metric] for r in runs]
        out[f"{section}.{metric}"] = {
            "best": min(values) if smaller else max(values),
            "median": statistics.median(values),
        }
    return out


def print_table(summary: dict[str, dict[int, dict[str, dict[str, float]]]]) -> None:
    cols = [
        ("hashes p50", "route_hashes.p50_us"),
        ("hashes p99", "route_hashes.p99_us"),
        ("hashes dec/s", "route_hashes.decisions_per_s"),
        ("hashes cpu p99", "route_hashes.cpu_p99_us"),
        ("hashes dec/cpu-s", "route_hashes.decisions_per_cpu_s"),
        ("tokens p50", "route_tokens.p50_us"),
        ("tokens p99", "route_tokens.p99_us"),
        ("tokens dec/s", "route_tokens.decisions_per_s"),
        ("hash p50", "hash_only.p50_us"),
    ]
    print("latencies in µs; each cell: best / median over the repeats")
    print(f"{'code':<9}{'W':>5}" + "".join(f"{name:>20}" for name, _ in cols))
    for label, per_w in summary.items():
        for w, s in per_w.items():
            cells = "".join(f"{s[k]['best']:>9.0f} / {s[k]['median']:<8.0f}" for _, k in cols)
            print(f"{label:<9}{w:>5}" + cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--token-decisions", type=int, default=2_000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=1, help="core to pin every run to")
    parser.add_argument("--baseline", help="tree whose `router` package to compare against")
    parser.add_argument("--out", default=str(results_file("routing", "decisions.json")))
    parser.add_argument("--code", help=argparse.SUPPRESS)  # child: tree to import from
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    if args.child:
        print(json.dumps(run_child(args)))
        return

    trees = ([("before", args.baseline)] if args.baseline else []) + [("after", "")]
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        label: {w: [] for w in args.workers} for label, _ in trees
    }
    common = [
        f"--blocks={args.blocks}",
        f"--decisions={args.decisions}",
        f"--token-decisions={args.token_decisions}",
        f"--warmup={args.warmup}",
        f"--cpu={args.cpu}",
    ]
    for rep in range(args.repeats):
        for w in args.workers:
            for label, tree in trees:
                cmd = [
                    sys.executable,
                    "-m",
                    "bench.routing.decisions",
                    "--child",
                    f"--workers={w}",
                    *common,
                ]
                if tree:
                    cmd.append(f"--code={tree}")
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True)
                run = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[label][w].append(run)
                hashes = run["route_hashes"]
                print(
                    f"[{rep + 1}/{args.repeats}] {label} W={w}: p50 {hashes['p50_us']:.1f} µs, "
                    f"p99 {hashes['p99_us']:.1f} µs, {hashes['decisions_per_s']:.0f} dec/s",
                    flush=True,
                )
    summary = {
        label: {w: summarise(rs) for w, rs in per_w.items()} for label, per_w in runs.items()
    }
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    results = {
        "host": platform.node(),
        "python": platform.python_version(),
        "method": __doc__,
        "pinned_cpu": args.cpu,
        "load_average_at_end": load,
        "trees": {label: tree or "this checkout" for label, tree in trees},
        "summary": summary,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print_table(summary)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
