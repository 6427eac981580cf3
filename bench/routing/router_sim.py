"""Routing policies against the pooled-LRU oracle, in one table per run (no model).

    python -m bench.routing.router_sim               # 8 workers; Mooncake at 150/600/2000
    python -m bench.routing.router_sim --capacity 600 --workers 16 --load 0.9
    python -m bench.routing.router_sim --trace ../shared/traces/mooncake/synthetic_trace.jsonl
    python -m bench.routing.router_sim --redis       # also 4 router replicas over Redis
                                                     # (--replica-sync-ms: their views' age)
    python -m bench.routing.router_sim --late-binding        # route when a worker has room
    python -m bench.routing.router_sim --gate-max-skips 0    # every queue first in, first out
    python -m bench.routing.router_sim --balance-slack 0.15  # the ttft bounded-load slack
    python -m bench.routing.router_sim --balance-measured    # its bound on measured work too
    python -m bench.routing.router_sim --policy-args '{"balance_room": false}'  # any ttft arg
    python -m bench.routing.router_sim --load 0.9 --peak     # the busiest tenth 90% busy

Workloads: the Mooncake FAST'25 synthetic trace (512-token blocks; found beside the checkout,
see loadgen.traces.traces_dir, or given by --trace) at each `--capacity` (blocks per
worker), and the generated `shared_prefix`, `multi_turn` and `light_then_burst` (16-token
blocks) at `--small-capacity`. Workers are planner.sim.prefill: an LRU cache in front of a FIFO
queue whose service times come from a measured profile (bench.paths; --profile).

Clock: traces are replayed at `--load` (computing every prompt in full would keep the pool
that busy; planner.sim.prefill_pool.at_load), so the queueing regime does not depend on which device
the profile was measured on. The load is the whole trace's average, or with `--peak` its
busiest tenth's: Mooncake's prompts grow along the trace, its last tenth brings 1.87x the
average work a second, so at `--load 0.8` the pool is overloaded through its second half.
light_then_burst is built from the profile: its light phase is spaced twice the longest
prefill apart (no queue ever forms), its burst arrives at `--burst-load` times what the
pool serves with every system prompt cached (saturation).

Late binding (`--late-binding`, as `baton serve --late-binding`): arrivals wait in one
queue and the oldest is routed whenever some worker has no request waiting to start (the
front door's gate holds a worker's admitted prompt tokens to about one or two engine steps;
here, to the one running prefill), so decisions see the caches as they are then.

Per policy: computed prefill tokens, prefix hit rate (cached prompt tokens / prompt tokens),
its ratio to the oracle's, load max / mean (prefill time each worker was given) and TTFT
p50 / p99 (queue wait + prefill). The oracle is one LRU cache pooling every worker's capacity
(an upper bound on reuse; it has no queue). JSON and the table go to `--out` (.json, .md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.paths import DEFAULT_PROFILE, results_file
from bench.routing.report import add_ratios, misses_table, table
from core.perf import WorkerProfile
from loadgen.traces import (
    DEFAULT_TRACE,
    TraceRequest,
    light_then_burst,
    multi_turn,
    read_jsonl,
    resolve_trace,
    shared_prefix,
)
from planner.sim.misses import MissLedger
from planner.sim.prefill_pool import REPLICA_SYNC_MS, at_load, pooled_lru_oracle, simulate
from router.routing.index.pending import DEFAULT_TTL_S
from router.routing.route import Router, RouterConfig

POLICIES = ("ttft", "ttft_no_pull", "cache_aware", "least_loaded", "round_robin")
"""Rows of the table. `ttft` pulls prefixes from peers when the profile gives a transfer rate;
`ttft_no_pull` is the same policy without migration, to show what migration buys."""


def policy_config(
    label: str,
    profile: WorkerProfile,
    balance_slack: float | None = None,
    measured: bool = False,
    extra: dict[str, float | bool] | None = None,
) -> tuple[str, dict[str, float | bool]]:
    """(registered policy name, its arguments) of a table row's label; `balance_slack`, if
    given, replaces the `ttft` policy's default (router/routing/policies/ttft/),
    `measured` turns on its bound on measured work, `extra` sets any other of its
    arguments."""
    bound: dict[str, float | bool] = dict(extra or {})
    if balance_slack is not None:
        bound["balance_slack"] = balance_slack
    if measured:
        bound["balance_measured"] = True
    if label == "ttft":
        return "ttft", {**profile.policy_args(), **bound}
    if label == "ttft_no_pull":
        return "ttft", bound
    return label, {}


def make_routers(
    policy: str,
    num_workers: int,
    block_size: int,
    replicas: int = 1,
    redis_url: str | None = None,
    ns: str = "",
    policy_args: dict[str, float | bool] | None = None,
    pending_ttl_s: float = DEFAULT_TTL_S,
    gate_max_skips: int = RouterConfig.gate_max_skips,
) -> list[Router]:
    """Routers that know the trace's block size: a hit of k blocks is k * block_size tokens.
    `gate_max_skips` is the simulated workers' queue order too (planner.sim.prefill)."""
    routers = []
    for _ in range(replicas):
        store = None
        if redis_url:
            from router.routing.index.redis_store import RedisStore

            store = RedisStore(url=redis_url, namespace=ns, poll_ms=5)
        cfg = RouterConfig(
            prefill_policy=policy,
            prefill_policy_args=policy_args or {},
            disagg_min_uncached_tokens=0,
            pending_ttl_s=pending_ttl_s,
            gate_max_skips=gate_max_skips,
        )
        router = Router(cfg, store=store)
        router.register_model("m", block_size=block_size)
        for i in range(num_workers):
            router.add_worker(f"p{i}", "prefill", "m")
        router.add_worker("d0", "decode", "m")
        routers.append(router)
    return routers


def burst_trace(profile: WorkerProfile, num_workers: int, burst_load: float) -> list[TraceRequest]:
    """light_then_burst with its clock from the profile (see the module docstring)."""
    longest = profile.prefill_ms(16 * (1 + 40 + 6 + 1))
    mean_user = profile.prefill_ms(16 * 4, context=16 * 25)
    rate = burst_load * num_workers * 1000 / mean_user
    return light_then_burst(light_gap_ms=2 * longest, burst_rate_per_s=rate)


def run_workload(
    trace: list[TraceRequest],
    capacity: int,
    block: int,
    args: argparse.Namespace,
    profile: WorkerProfile,
) -> dict:
    oracle = pooled_lru_oracle(trace, capacity * args.workers, block)
    res: dict = {"capacity_blocks": capacity, "block_size": block, "oracle_pooled_lru": oracle}
    for label in args.policies:
        name, policy_args = policy_config(
            label, profile, args.balance_slack, args.balance_measured, args.policy_args
        )
        routers = make_routers(
            name, args.workers, block, policy_args=policy_args,
            pending_ttl_s=args.prefix_promise_s, gate_max_skips=args.gate_max_skips,
        )  # fmt: skip
        ledger = MissLedger(capacity * args.workers)
        res[label] = simulate(
            trace, routers, args.workers, capacity, block, profile, ledger,
            late_binding=args.late_binding,
        )  # fmt: skip
        res[label]["misses"] = ledger.summary()
        add_ratios(res[label], oracle)
    if args.redis:
        name, policy_args = policy_config(
            args.policies[0], profile, args.balance_slack, args.balance_measured,
            args.policy_args,
        )  # fmt: skip
        key = f"{args.policies[0]}_4_replicas_redis"
        with redis_server() as url:
            res[key] = simulate_replicas(
                trace, url, 4, name, policy_args, args.workers, capacity, block, profile,
                args.prefix_promise_s, args.replica_sync_ms, args.late_binding,
                args.gate_max_skips,
            )  # fmt: skip
        add_ratios(res[key], oracle)
    return res


def simulate_replicas(
    trace: list[TraceRequest], url: str, replicas: int, policy: str,
    policy_args: dict[str, float | bool], workers: int, capacity: int, block: int,
    profile: WorkerProfile, pending_ttl_s: float = DEFAULT_TTL_S,
    sync_ms: float = REPLICA_SYNC_MS, late_binding: bool = False,
    gate_max_skips: int = RouterConfig.gate_max_skips,
) -> dict:  # fmt: skip
    """`simulate` with `replicas` routers over the Redis at `url` (a namespace of their own),
    taking arrivals in turn."""
    ns = f"sim:{time.monotonic_ns()}"
    routers = make_routers(
        policy, workers, block, replicas, url, ns, policy_args, pending_ttl_s, gate_max_skips
    )
    try:
        for r in routers:
            r.store.sync(10)
        return simulate(
            trace, routers, workers, capacity, block, profile, sync_ms=sync_ms,
            late_binding=late_binding,
        )  # fmt: skip
    finally:
        for r in routers:
            r.close()


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A fresh `redis-server` on a free loopback port, no persistence; yields its URL and
    ends it (by its PID) on the way out."""
    workdir = tempfile.mkdtemp()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binary = shutil.which("redis-server") or "redis-server"
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument(
        "--capacity", type=int, nargs="+", default=[150, 600, 2000],
        help="blocks per worker for the Mooncake trace (512-token blocks)",
    )  # fmt: skip
    p.add_argument(
        "--small-capacity", type=int, default=200,
        help="blocks per worker for the generated workloads (16-token blocks)",
    )  # fmt: skip
    p.add_argument("--requests", type=int, default=4000, help="requests per workload at most")
    p.add_argument(
        "--trace", default=str(DEFAULT_TRACE["mooncake"]),
        help="a Mooncake-format JSONL trace (relative paths: cwd, then repo root)",
    )  # fmt: skip
    p.add_argument("--profile", default=str(DEFAULT_PROFILE), help="worker profile JSON")
    p.add_argument(
        "--load", type=float, default=0.8,
        help="pool busy share if nothing were cached (0: the trace's own clock)",
    )  # fmt: skip
    p.add_argument(
        "--peak", action="store_true",
        help="--load is the busiest tenth's of the trace, not the whole trace's",
    )  # fmt: skip
    p.add_argument("--burst-load", type=float, default=1.0)
    p.add_argument("--policies", nargs="+", default=list(POLICIES))
    p.add_argument(
        "--workloads", nargs="+",
        default=["mooncake", "shared_prefix", "multi_turn", "light_then_burst"],
    )  # fmt: skip
    p.add_argument("--redis", action="store_true", help="also 4 replicas on Redis (1st policy)")
    p.add_argument(
        "--replica-sync-ms", type=float, default=REPLICA_SYNC_MS,
        help="how old a replica's view of the others' decisions gets (bench.routing.replica_sync)",
    )  # fmt: skip
    p.add_argument(
        "--prefix-promise-s", type=float, default=DEFAULT_TTL_S,
        help="seconds a routed prefill's blocks count before its events (0: events only)",
    )  # fmt: skip
    p.add_argument(
        "--late-binding", action="store_true",
        help="route each request when a worker has nothing waiting, not when it arrives",
    )  # fmt: skip
    p.add_argument(
        "--gate-max-skips", type=int, default=RouterConfig.gate_max_skips,
        help="times a queued request may be passed over by one with a longer cached prefix "
        "(as baton serve's; 0: every worker's queue first in, first out)",
    )  # fmt: skip
    p.add_argument(
        "--balance-slack", type=float, default=None,
        help="the ttft policy's bounded-load slack (default: the policy's own, 0.2)",
    )  # fmt: skip
    p.add_argument(
        "--balance-measured", action="store_true",
        help="the ttft policy bounds the work measured as well as the work it placed",
    )  # fmt: skip
    p.add_argument(
        "--policy-args", type=json.loads, default={},
        help="JSON: more of the ttft rows' policy arguments, e.g. '{\"balance_room\": false}'",
    )  # fmt: skip
    p.add_argument("--out", default=str(results_file("routing", "router_sim.json")))
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    profile = WorkerProfile.load(resolve_trace(args.profile))
    n, small = args.workers, args.small_capacity
    runs: dict = {}
    for name in args.workloads:
        if name == "mooncake":
            path = resolve_trace(args.trace)
            if not path.exists():
                print(f"no trace at {path}: the Mooncake runs are skipped (--trace PATH)")
                continue
            trace = at_load(read_jsonl(path, args.requests), profile, n, args.load, args.peak)
            for cap in args.capacity:
                runs[f"mooncake@{cap}"] = run_workload(trace, cap, 512, args, profile)
        elif name == "shared_prefix":
            prompts = shared_prefix(num_requests=args.requests)
            trace = at_load(prompts, profile, n, args.load, args.peak)
            runs[name] = run_workload(trace, small, 16, args, profile)
        elif name == "multi_turn":
            sessions = multi_turn(num_sessions=args.requests // 5)
            runs[name] = run_workload(
                at_load(sessions, profile, n, args.load, args.peak), small, 16, args, profile
            )
        elif name == "light_then_burst":
            trace = burst_trace(profile, n, args.burst_load)
            runs[name] = run_workload(trace, small, 16, args, profile)
        else:
            raise SystemExit(f"unknown workload {name!r}")
        print(f"{name} done", flush=True)
    results = {
        "workers": n,
        "load": args.load,
        "load_of_peak": args.peak,
        "burst_load": args.burst_load,
        "replica_sync_ms": args.replica_sync_ms if args.redis else None,
        "balance_slack": args.balance_slack,
        "balance_measured": args.balance_measured,
        "policy_args": args.policy_args,
        "gate_max_skips": args.gate_max_skips,
        "profile": profile.__dict__,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    text = (
        table(runs)
        + "\n\nWhere the prompt blocks went (shares of all blocks):\n\n"
        + misses_table(runs)
    )
    out.with_suffix(".md").write_text(text + "\n")
    print(text)
    print(f"-> {out} and {out.with_suffix('.md')}")
    return results


if __name__ == "__main__":
    main()
