"""`baton plan`: size the prefill and decode pools for a workload from a measured profile.

    # the profile of one worker on the target node type (docs/deploy.md, "Profiling")
    baton profile --model /ckpt --device cuda --out h100.json
    # every split of 8 workers, the Azure conversation trace at its own pace
    baton plan --profile h100.json --workers 8 --workload azure --ttft-slo 2 --tpot-slo 0.1
    # one configuration, to compare with a real run of `baton bench` (same workload flags)
    baton plan --profile cpu.json --prefill 1 --decode 1 --workload shared_prefix --rate 2

The workload flags are `baton bench`'s (loadgen/cli.py add_workload_arguments): a plan
replays exactly the requests that benchmark would send, through a discrete-event model of
the cluster (planner/sim/cluster.py: Baton's router and policies, prefix caches, FIFO prefill,
KV transfer, continuous-batching decode with the short prompts it prefills itself mixed in)
timed by the profile. It prints, per configuration, the expected TTFT and ITL (mean time per
output token after the first, as `baton bench` reports TPOT) at p50 / p99 and the goodput
(share of requests meeting both targets), and picks the smallest configuration whose goodput
is within 1% of the best. How close a plan comes to a real run: `python -m
bench.planning.plan_validate` (docs/performance.md).

CPU workers share their host's cores with the serving work: `--host-cpu` (planner/sim/host.py,
measured by `python -m bench.planning.host_cpu`) models that.

Tensor parallelism: one profile per TP size (`--profile tp1.json --profile tp2.json`, each
measured with that TP); a worker of TP t counts as t GPUs against `--workers`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from core.hashing import hash_prompt_blocks, model_root_hash
from core.perf import WorkerProfile
from loadgen import workloads as wl
from loadgen.schedule import add_workload_arguments, fill_workload_defaults, schedules
from loadgen.traces import TraceRequest
from planner.sim.cluster import (
    DecodeProfile,
    HostCPU,
    RequestOverhead,
    simulate_cluster,
    summarize,
)  # fmt: skip

BLOCK = 16


def trace_of(requests: list[TraceRequest], duration_s: float) -> list[TraceRequest]:
    """Benchmark requests as a simulator trace: the prompt's chained block hashes, as the
    engines and the router compute them (two prompts share a block id exactly when they
    share that prefix); only those sent within `duration_s`, as the benchmark's client does."""
    root = model_root_hash("baton-plan", BLOCK)
    out = []
    for r in requests:
        if r.arrival_s > duration_s:
            break
        toks = r.prompt_token_ids
        ids = [int(h) for h in hash_prompt_blocks(toks, BLOCK, root)]
        out.append(TraceRequest(arrival_ms=int(r.arrival_ms), input_length=len(toks),
                                output_length=r.output_length, hash_ids=ids))  # fmt: skip
    return out


def candidates(args: argparse.Namespace, tps: list[int]) -> list[tuple[int, int, int]]:
    """(tp, prefill workers, decode workers) to simulate."""
    if args.prefill is not None or args.decode is not None:
        return [(tps[0], args.prefill or 1, args.decode or 1)]
    out = []
    for tp in tps:
        budget = args.workers // tp
        out += [(tp, p, d) for p in range(1, budget) for d in range(1, budget - p + 1)]
    return out


def plan(args: argparse.Namespace, keep_records: bool = False) -> dict[str, Any]:
    """Every candidate simulated (`runs`) and the `pick`; with `keep_records`, each run also
    holds its per-request records (planner.sim.cluster), in the order the benchmark sends them,
    and its workers' busy time (`workers`)."""
    fill_workload_defaults(args)
    profiles = {}
    for path in args.profile:
        raw = json.loads(Path(path).read_text())
        profiles[int(raw.get("tp", 1))] = (WorkerProfile.load(path), DecodeProfile.load(path))
    runs = []
    for rate, timed in schedules(args, wl.TokenSpace(*args.token_range)):
        trace = trace_of(timed, args.duration)
        for tp, p, d in candidates(args, sorted(profiles)):
            prefill, decode = profiles[tp]
            workers: dict[str, dict[str, float]] = {}
            host = None
            if args.host_cpu:
                cores, base, request_ms, token_ms, share, co_run = args.host_cpu
                host = HostCPU(cores, base, request_ms, token_ms, share, co_run, args.threads)
            records = simulate_cluster(
                trace, prefill, decode, p, d, policy=args.policy, block_size=BLOCK,
                kv_blocks_per_worker=args.kv_blocks, max_seqs=args.max_num_seqs,
                overhead=RequestOverhead(*args.request_overhead_ms),
                disagg_min_uncached_tokens=args.disagg_min_uncached_tokens, workers_out=workers,
                host=host,
            )  # fmt: skip
            s = summarize(records, args.ttft_slo * 1000, args.tpot_slo * 1000)
            runs.append({"rate": rate, "tp": tp, "prefill": p, "decode": d, **s})
            if keep_records:
                runs[-1].update(records=records, workers=workers)
    best = max(r["goodput"] for r in runs)
    pick = min(
        (r for r in runs if r["goodput"] >= best - 0.01),
        key=lambda r: (r["tp"] * (r["prefill"] + r["decode"]), r["ttft_p99_ms"]),
    )
    return {"runs": runs, "pick": pick}


def _table(result: dict[str, Any]) -> str:
    lines = ["| rate | tp | prefill | decode | TTFT p50 / p99 ms | ITL p50 / p99 ms | goodput |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in result["runs"]:
        mark = " **(pick)**" if r is result["pick"] else ""
        lines.append(
            f"| {r['rate']:.2f} | {r['tp']} | {r['prefill']} | {r['decode']} | "
            f"{r['ttft_p50_ms']:,.0f} / {r['ttft_p99_ms']:,.0f} | "
            f"{r['itl_p50_ms']:,.1f} / {r['itl_p99_ms']:,.1f} | {r['goodput']:.2f}{mark} |"
        )
    return "\n".join(lines)


def build_arg_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--profile", action="append", required=True,
                   help="a `baton profile` JSON (one per TP size)")  # fmt: skip
    p.add_argument("--workers", type=int, default=4, help="GPUs (workers x TP) to split")
    p.add_argument("--prefill", type=int, default=None, help="simulate this split only")
    p.add_argument("--decode", type=int, default=None, help="simulate this split only")
    p.add_argument("--policy", default="cache_aware", help="the router's prefill policy")
    p.add_argument("--kv-blocks", type=int, default=4096, help="KV blocks per worker")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument(
        "--disagg-min-uncached-tokens",
        type=int,
        default=256,
        metavar="N",
        help="as `baton serve`'s: a prompt whose part its decode worker does not hold is "
        "shorter than this is prefilled there (0: every prompt in the prefill pool)",
    )
    p.add_argument(
        "--request-overhead-ms", type=float, nargs=2, default=[0.0, 0.0],
        metavar=("LOCAL", "DISAGG"),
        help="serving overhead on each first token, beyond the engine steps, for a prompt its "
        "decode worker prefills and one through the prefill pool (python -m "
        "bench.planning.request_overhead measures both on a running cluster); 0 0: none",
    )  # fmt: skip
    p.add_argument(
        "--host-cpu", type=float, nargs=6, default=None,
        metavar=("CORES", "BASE", "REQUEST_MS", "TOKEN_MS", "SHARE", "CO_RUN"),
        help="model the host's CPUs, shared by the engines and the serving work (planner/"
        "sim/host.py): its cores, the serving CPU at idle (cores), per request and per "
        "output token (ms), the share of it that runs on a stepping engine's core even "
        "with a core free, and how much slower an engine steps for each other engine "
        "stepping beside it; python -m bench.planning.host_cpu --profile P measures the last "
        "five on a running cluster. Default: the engines never wait for a core",
    )  # fmt: skip
    p.add_argument("--threads", type=int, default=1,
                   help="compute threads per worker, as `baton serve --threads` "
                   "(with --host-cpu)")  # fmt: skip
    p.add_argument("--out", default=None, help="JSON results")
    add_workload_arguments(p)
    return p


def run_from_args(args: argparse.Namespace) -> int:
    result = plan(args)
    print(_table(result))
    pick = result["pick"]
    print(f"\npick: tp={pick['tp']}, {pick['prefill']} prefill + {pick['decode']} decode "
          f"(goodput {pick['goodput']:.2f})")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def register_command(sub: argparse._SubParsersAction) -> None:
    """`baton plan`: registered through the `baton.commands` entry point (pyproject.toml)."""
    p = sub.add_parser("plan", help="size the pools for a workload from a measured profile")
    build_arg_parser(p)
    p.set_defaults(func=run_from_args)


def main(argv: list[str] | None = None) -> int:
    parser = build_arg_parser(argparse.ArgumentParser(prog="baton plan", description=__doc__))
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
