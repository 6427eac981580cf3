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
is within 1% of the best. The splits are every one of `--workers`, an empty prefill pool
included (decode workers then prefill every prompt themselves).

Checking a plan against the cluster it plans: `--validate N` serves its best N splits for real
and ranks them as served beside the plan's ranking (planner/validate.py); `--calibration-out`
keeps what those runs measured against the plan, and `--calibration` plans with it
(planner/calibration.py: the served runs' measured / planned ratio of each latency figure,
a p50's largest and a p99's median, so a plan that errs errs pessimistic). How close a plan
comes to repeated real runs: `python -m bench.planning.plan_validate` (docs/performance.md).

CPU workers share their host's cores with the serving work: `--host-cpu` (planner/sim/host.py,
measured by `python -m bench.planning.host_cpu`) models that.

Tensor parallelism: one profile per TP size (`--profile tp1.json --profile tp2.json`, each
measured with that TP); a worker of TP t counts as t GPUs against `--workers`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from core.hashing import hash_prompt_blocks, model_root_hash
from core.perf import WorkerProfile
from loadgen import workloads as wl
from loadgen.schedule import add_workload_arguments, fill_workload_defaults, schedules
from loadgen.traces import TraceRequest
from planner import validate as served_splits
from planner.calibration import Calibration
from planner.sim.cluster import (
    DecodeProfile,
    HostCPU,
    RequestOverhead,
    simulate_cluster,
    summarize,
)  # fmt: skip

BLOCK = 16


def _at_least(low: int):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    return parse


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
    """(tp, prefill workers, decode workers) to simulate: every split of the budget, an empty
    prefill pool included (decode workers then prefill every prompt themselves)."""
    if args.prefill is not None or args.decode is not None:
        prefill = 1 if args.prefill is None else args.prefill
        return [(tps[0], prefill, 1 if args.decode is None else args.decode)]
    out = []
    for tp in tps:
        budget = args.workers // tp
        out += [(tp, p, d) for p in range(0, budget) for d in range(1, budget - p + 1)]
    return out


def plan(args: argparse.Namespace, keep_records: bool = False) -> dict[str, Any]:
    """Every candidate simulated (`runs`) and the `pick`; with `keep_records`, each run also
    holds its per-request records (planner.sim.cluster), in the order the benchmark sends them,
    and its workers' busy time (`workers`)."""
    fill_workload_defaults(args)
    calibration = Calibration.load(args.calibration) if args.calibration else None
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
            if calibration is not None:
                s = calibration.apply(s, records, args.ttft_slo * 1000, args.tpot_slo * 1000)
            runs.append({"rate": rate, "tp": tp, "prefill": p, "decode": d, **s})
            if keep_records:
                runs[-1].update(records=records, workers=workers)
    best = max(r["goodput"] for r in runs)
    pick = min(
        (r for r in runs if r["goodput"] >= best - 0.01),
        key=lambda r: (r["tp"] * (r["prefill"] + r["decode"]), r["ttft_p99_ms"]),
    )
    result = {"runs": runs, "pick": pick}
    if calibration is not None:
        result["calibration"] = {"factors": calibration.factors, "source": calibration.source}
    return result


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
    p.add_argument(
        "--prefill",
        type=_at_least(0),
        default=None,
        help="simulate this split only (0: decode workers prefill every prompt)",
    )
    p.add_argument("--decode", type=_at_least(1), default=None, help="simulate this split only")
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
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="multiply the plan's latencies by what served runs measured against "
                   "it (planner/calibration.py; written by --calibration-out)")  # fmt: skip
    p.add_argument("--validate", type=_at_least(1), default=None, metavar="N",
                   help="serve the plan's best N splits for real (needs --model) and rank them "
                   "as served beside the plan's ranking (planner/validate.py)")  # fmt: skip
    p.add_argument("--validate-runs", type=_at_least(1), default=1, metavar="K",
                   help="--validate: serve each split K times, the splits taking turns, and "
                   "rank by each figure's median over its runs")  # fmt: skip
    p.add_argument("--model", default=None, help="--validate: the checkpoint to serve")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="--validate: one more `baton serve` argument (repeat it)")  # fmt: skip
    p.add_argument("--calibration-out", default=None, metavar="FILE",
                   help="--validate: write the served runs' measured / planned latencies "
                   "as a calibration")  # fmt: skip
    p.add_argument("--out", default=None, help="JSON results")
    add_workload_arguments(p)
    return p


def run_from_args(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (ValueError, OSError) as e:  # a flag the plan cannot use: say which, no traceback
        print(f"baton plan: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.validate and not args.model:
        raise ValueError("--validate needs --model (the checkpoint the splits serve)")
    if args.calibration_out and not args.validate:
        raise ValueError("--calibration-out needs --validate (served runs to calibrate from)")
    result = plan(args)
    print(_table(result))
    pick = result["pick"]
    print(f"\npick: tp={pick['tp']}, {pick['prefill']} prefill + {pick['decode']} decode "
          f"(goodput {pick['goodput']:.2f})")  # fmt: skip
    if args.validate:
        validation = served_splits.validate(args, result)
        result["validation"] = validation
        print(served_splits.table(validation))
        print("the plan's first is the served first" if validation["agrees"]
              else "the plan's first is NOT the served first")  # fmt: skip
        if args.calibration_out:
            cal = served_splits.calibration_of(validation, "baton plan --validate")
            cal.save(args.calibration_out)
            print(f"calibration {cal.factors} -> {args.calibration_out}")
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
