"""The `ttft` policy against the routing targets in the simulator, over many runs, not one.

    python -m bench.routing.router_sweep                   # the policy's defaults
    python -m bench.routing.router_sweep --policy-args '{"balance_slack": 0.2}'
    python -m bench.routing.router_sweep --loads 0.8 0.9 --capacity 600 --no-burst
    python -m bench.routing.router_sweep --workers 16      # a pool not tuned on
    python -m bench.routing.router_sweep --replicas 4      # and 4 Redis replicas
    python -m bench.routing.router_sweep --gate-max-skips 0 # queues first in, first out
    python -m bench.routing.router_sweep --clock-jitter 0.001 # one router against itself

One run of the simulator (bench.routing.router_sim) decides little: on the Mooncake trace at small
caches a change of the clock by a few percent moves reuse / oracle by +-0.05, because which
prefixes survive depends on the order the queues drain in. So this runs `ttft` (with
migration, as `python -m bench.routing.router_sim` does) over a grid and counts the runs that meet
the targets:

- Mooncake's synthetic trace at each `--capacity` (blocks per worker) and each `--loads`
  (the busiest tenth of the trace that busy: `--peak` in bench.routing.router_sim): reuse >= 0.9 of
  the pooled-LRU oracle and load max/mean <= 1.2;
- light_then_burst at each `--burst-loads`, routed at arrival and with late binding: reuse >=
  0.9 of the oracle and max/mean <= 1.3.

With `--replicas N` every run is routed a second time by N router replicas over one Redis
(bench.routing.router_sim's `--redis`: a fresh `redis-server`, the replicas taking arrivals
in turn), and the summary adds what they computed against the one router (target: within
2%). With
`--clock-jitter F` the one router routes each run again on its trace's clock F faster: what
two runs differ by when nothing else changes, the resolution any per-run ratio here has.

Prints one line per run and a summary per workload (runs meeting both, mean and least reuse /
oracle, mean and largest max/mean); JSON and the table to `--out`. About 40 s for the default
grid (11 loads x 3 capacities + 6 bursts) on one core; with replicas about 35 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from bench.paths import DEFAULT_PROFILE, results_file
from bench.routing.report import add_ratios
from bench.routing.router_sim import (
    burst_trace,
    make_routers,
    policy_config,
    redis_server,
    simulate_replicas,
)
from core.perf import WorkerProfile
from loadgen.traces import DEFAULT_TRACE, read_jsonl, resolve_trace
from planner.sim.prefill_pool import at_load, pooled_lru_oracle, simulate
from router.routing.route import RouterConfig

TARGETS = {"mooncake": (0.9, 1.2), "light_then_burst": (0.9, 1.3)}
"""(least reuse / oracle, largest load max/mean) per workload: the routing targets."""


def run_one(
    trace: list, capacity: int, block: int, policy_args: dict, profile: WorkerProfile, late: bool,
    workers: int = 8, redis: tuple[str, int] | None = None,
    gate_max_skips: int = RouterConfig.gate_max_skips, twin: list | None = None,
) -> dict:  # fmt: skip
    """One run; with `redis` (url, replicas), the same run again through that many replicas
    (promises and sync at bench.routing.router_sim's defaults); with `twin` (the trace on a clock a
    little faster), the one router again on it."""

    def one_router(trace: list) -> dict:
        routers = make_routers(
            "ttft", workers, block, policy_args=policy_args, gate_max_skips=gate_max_skips
        )
        return simulate(trace, routers, workers, capacity, block, profile, late_binding=late)

    oracle = pooled_lru_oracle(trace, capacity * workers, block)
    res = one_router(trace)
    add_ratios(res, oracle)
    row = {
        "reuse_over_oracle": res["reuse_over_oracle"],
        "load_max_over_mean": res["load_max_over_mean"],
        "ttft_p50_s": res["ttft_p50_ms"] / 1000,
    }
    if redis is not None:
        url, n = redis
        many = simulate_replicas(
            trace, url, n, "ttft", policy_args, workers, capacity, block, profile,
            late_binding=late, gate_max_skips=gate_max_skips,
        )  # fmt: skip
        row["replicas_computed_over_one"] = many["computed_tokens"] / res["computed_tokens"]
    if twin is not None:
        row["jitter_computed_over_one"] = (
            one_router(twin)["computed_tokens"] / res["computed_tokens"]
        )
    return row


def sweep(args: argparse.Namespace) -> list[dict]:
    with redis_server() if args.replicas else contextlib.nullcontext() as url:
        return _sweep(args, (url, args.replicas) if url else None)


def _sweep(args: argparse.Namespace, redis: tuple[str, int] | None) -> list[dict]:
    profile = WorkerProfile.load(resolve_trace(args.profile))
    _, policy_args = policy_config("ttft", profile)
    policy_args.update(args.policy_args)
    rows: list[dict] = []
    n, skips, jitter = args.workers, args.gate_max_skips, args.clock_jitter
    if args.capacity:
        raw = read_jsonl(resolve_trace(args.trace), args.requests)
        for load in args.loads:
            trace = at_load(raw, profile, n, load, peak=True)
            twin = at_load(raw, profile, n, load * (1 + jitter), peak=True) if jitter else None
            for cap in args.capacity:
                res = run_one(
                    trace, cap, 512, policy_args, profile, args.late_binding, n, redis, skips,
                    twin,
                )  # fmt: skip
                rows.append({"workload": "mooncake", "blocks": cap, "load": load, **res})
    for late in () if args.no_burst else (False, True):
        for load in args.burst_loads:
            trace = burst_trace(profile, n, load)
            twin = burst_trace(profile, n, load * (1 + jitter)) if jitter else None
            res = run_one(trace, 200, 16, policy_args, profile, late, n, redis, skips, twin)
            rows.append({"workload": "light_then_burst", "blocks": 200, "load": load,
                         "late_binding": late, **res})  # fmt: skip
    for row in rows:
        least, most = TARGETS[row["workload"]]
        row["meets"] = row["reuse_over_oracle"] >= least and row["load_max_over_mean"] <= most
    return rows


RATIOS = {
    "replicas_computed_over_one": "replicas / one, computed",
    "jitter_computed_over_one": "one, clock faster / one, computed",
}
"""Per-run ratios a summary adds a column for (mean, range), where the runs have them."""


def summary(rows: list[dict]) -> str:
    extra = [key for key in RATIOS if rows and key in rows[0]]
    lines = [
        "| workload | blocks/worker | runs meeting both | reuse / oracle: mean, least "
        "| load max/mean: mean, largest |" + "".join(f" {RATIOS[k]}: mean, range |" for k in extra),
        "| --- | ---: | ---: | --- | --- |" + " --- |" * len(extra),
    ]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        name = row["workload"] + (" (late)" if row.get("late_binding") else "")
        groups.setdefault((name, row["blocks"]), []).append(row)
    for (name, blocks), group in groups.items():
        reuse = [r["reuse_over_oracle"] for r in group]
        spread = [r["load_max_over_mean"] for r in group]
        met = sum(r["meets"] for r in group)
        line = (
            f"| {name} | {blocks} | {met} of {len(group)} | {sum(reuse) / len(reuse):.3f}, "
            f"{min(reuse):.3f} | {sum(spread) / len(spread):.3f}, {max(spread):.3f} |"
        )
        for key in extra:
            ratio = [r[key] for r in group]
            line += f" {sum(ratio) / len(ratio):.3f}, {min(ratio):.3f}-{max(ratio):.3f} |"
        lines.append(line)
    met = sum(r["meets"] for r in rows)
    lines.append(f"| all | | **{met} of {len(rows)}** | |" + " |" * (1 + len(extra)))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--policy-args", type=json.loads, default={}, help="JSON: the ttft policy's arguments"
    )
    p.add_argument("--workers", type=int, default=8, help="prefill workers (the targets: 8)")
    p.add_argument("--capacity", type=int, nargs="*", default=[150, 600, 2000])
    p.add_argument("--loads", type=float, nargs="+",
                   default=[round(0.75 + 0.025 * i, 3) for i in range(11)])  # fmt: skip
    p.add_argument("--burst-loads", type=float, nargs="+", default=[0.8, 1.0, 1.2])
    p.add_argument("--no-burst", action="store_true", help="Mooncake only")
    p.add_argument("--replicas", type=int, default=0, help="also route through N Redis replicas")
    p.add_argument(
        "--clock-jitter", type=float, default=0.0, metavar="F",
        help="also route each run by one router on its trace F faster (0.001: 0.1%%): how far "
        "apart two runs land when nothing else changes",
    )  # fmt: skip
    p.add_argument("--late-binding", action="store_true", help="Mooncake routed late too")
    p.add_argument(
        "--gate-max-skips", type=int, default=RouterConfig.gate_max_skips,
        help="the workers' queue order, as baton serve's (0: first in, first out)",
    )  # fmt: skip
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--trace", default=str(DEFAULT_TRACE["mooncake"]))
    p.add_argument("--profile", default=str(DEFAULT_PROFILE))
    p.add_argument("--out", default=str(results_file("routing", "router_sweep.json")))
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    rows = sweep(args)
    for r in rows:
        late = " late" if r.get("late_binding") else ""
        ratios = "".join(f", {RATIOS[k]} {r[k]:.3f}" for k in RATIOS if k in r)
        print(f"{r['workload']}{late} {r['blocks']} blocks, load {r['load']}: reuse / oracle "
              f"{r['reuse_over_oracle']:.3f}, max/mean {r['load_max_over_mean']:.3f}{ratios}"
              f"{'' if r['meets'] else '  (misses)'}")  # fmt: skip
    text = summary(rows)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    saved = {
        "policy_args": args.policy_args,
        "workers": args.workers,
        "replicas": args.replicas,
        "gate_max_skips": args.gate_max_skips,
        "clock_jitter": args.clock_jitter,
        "runs": rows,
    }
    out.write_text(json.dumps(saved, indent=1) + "\n")
    out.with_suffix(".md").write_text(text + "\n")
    return rows


if __name__ == "__main__":
    main()
