"""`baton plan --validate N`: the plan's first N splits served for real, ranked as served
beside the plan's ranking.

    baton plan --profile cpu.json --workers 2 --workload azure --time-scale 2 \\
        --num-requests 150 --validate 3 --model models/small

Each split (the best N of the plan's candidates at the first rate, by goodput, then TTFT p99)
is started as a fresh `baton serve` with that many prefill and decode workers and the engine
settings the plan assumed (`--max-num-seqs`, `--disagg-min-uncached-tokens`, `--threads`, a
KV cache of `--kv-blocks` blocks, TP from the profile), warmed with two requests no workload
shares, and sent exactly the requests the plan replayed (`baton bench`'s client, the same
workload flags). Measured, per split: the share of requests within both SLOs (`--ttft-slo`,
`--tpot-slo`), TTFT and TPOT p50 / p99. With `--validate-runs K` each split is served K times,
the splits taking turns (split 1, 2, 3, 1, 2, 3, ...: a host whose speed drifts moves every
split alike), and each figure is the median of its runs (each run's are kept beside). The
measured ranking uses the plan's own order (the share within the SLOs, then TTFT p99);
`agrees` says whether the plan's first is the served first. `--calibration-out` writes what
the served runs say of the plan's latencies (planner/calibration.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
from pathlib import Path
from typing import Any

from loadgen import cli as baton_bench
from loadgen import workloads as wl
from loadgen.compare import LOGS, warm_up
from loadgen.metrics import RequestResult
from loadgen.run import measure, served_model
from loadgen.schedule import add_workload_arguments, fill_workload_defaults, schedules
from loadgen.server import ServerProcess
from planner.calibration import METRICS, Calibration

BLOCK = 16


async def served(
    model_dir: Path, serve: list[str], flags: list[str], name: str
) -> tuple[dict[str, Any], list[RequestResult]]:
    """One real run of the workload (`baton bench`'s workload `flags`) on a fresh `baton
    serve` (`serve`: its arguments but --model): `baton bench`'s summary and the per-request
    results, in the order they were sent."""
    args = baton_bench.build_arg_parser(argparse.ArgumentParser()).parse_args(
        ["--url", "http://unused", "--no-progress", *flags]
    )
    fill_workload_defaults(args)
    ((rate, timed),) = schedules(args, wl.TokenSpace(*args.token_range))
    with ServerProcess([*serve, "--model", str(model_dir)], LOGS / f"plan_{name}.log") as server:
        model = await served_model(server.url)
        await warm_up(server.url, model, args)
        results: list[RequestResult] = []
        summary = await measure(server.url, model, rate, timed, args, name, results)
        return summary, results


def ranked(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan's candidates at its first rate, best first: goodput, then TTFT p99."""
    first = [r for r in runs if r["rate"] == runs[0]["rate"]]
    return sorted(first, key=lambda r: (-r["goodput"], r["ttft_p99_ms"]))


def kv_cache_gb(profile: Path, kv_blocks: int) -> float:
    """The `baton serve --kv-cache-gb` that gives a worker `kv_blocks` blocks of the model."""
    per_token = json.loads(profile.read_text()).get("kv_bytes_per_token", 0)
    if not per_token:
        raise ValueError(f"{profile}: no kv_bytes_per_token (measure it with `baton profile`)")
    return kv_blocks * BLOCK * per_token / (1 << 30)


def serve_args(args: argparse.Namespace, run: dict[str, Any], profile: Path) -> list[str]:
    """`baton serve`'s arguments for one split, as the plan modelled it."""
    return [
        "--prefill", str(run["prefill"]), "--decode", str(run["decode"]), "--tp", str(run["tp"]),
        "--max-num-seqs", str(args.max_num_seqs),
        "--disagg-min-uncached-tokens", str(args.disagg_min_uncached_tokens),
        "--threads", str(args.threads),
        "--kv-cache-gb", str(kv_cache_gb(profile, args.kv_blocks)), *args.serve_arg,
    ]  # fmt: skip


def workload_flags(args: argparse.Namespace) -> list[str]:
    """The workload flags (those `baton bench` and `baton plan` share) as `args` holds them."""
    parser = argparse.ArgumentParser()
    add_workload_arguments(parser)
    out: list[str] = []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest == "help" or value is None:
            continue
        if action.nargs == 0:  # a switch: on, or (a --x / --no-x pair) its off spelling
            if value is True or len(action.option_strings) > 1:
                out.append(action.option_strings[0 if value else -1])
        elif isinstance(value, (list, tuple)):
            out += [action.option_strings[0], *map(str, value)]
        else:
            out += [action.option_strings[0], str(value)]
    return out


def served_figures(summary: dict[str, Any]) -> dict[str, float]:
    """One served run's figures, as the plan names them."""
    served_ms = {f"{name}_{q}_ms": summary[key][q] * 1000
                 for name, key in (("ttft", "ttft_s"), ("itl", "tpot_s"))
                 for q in ("p50", "p99")}  # fmt: skip
    return {"goodput": summary["slo_attainment"], **served_ms,
            "lost": summary["num_errors"] + summary.get("num_not_sent", 0)}  # fmt: skip


def measured_row(run: dict[str, Any], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One validated split: the plan's figures beside the served ones (each the median of
    the split's served runs; `lost` their sum)."""
    each = [served_figures(s) for s in summaries]
    measured = {k: statistics.median(f[k] for f in each) for k in each[0] if k != "lost"}
    return {
        "tp": run["tp"], "prefill": run["prefill"], "decode": run["decode"],
        "planned": {k: run[k] for k in ("goodput", *(f"{m}_ms" for m in METRICS))},
        "model": {f"{m}_ms": run.get(f"model_{m}_ms", run[f"{m}_ms"]) for m in METRICS},
        "measured": {**measured, "lost": sum(f["lost"] for f in each)},
        "measured_runs": each,
    }  # fmt: skip


def validate(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """Serve the plan's best `args.validate` splits of `args.model`; the rows, both rankings
    and `agrees`."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line a request: noise here
    profiles = {int(json.loads(Path(p).read_text()).get("tp", 1)): Path(p) for p in args.profile}
    best = ranked(result["runs"])
    at_one_rate = argparse.Namespace(**vars(args))
    if args.rate is not None:  # the splits are served at the rate they were ranked at
        at_one_rate.rate = [best[0]["rate"]]
    flags = workload_flags(at_one_rate)
    splits = best[: args.validate]
    runs = getattr(args, "validate_runs", 1)
    summaries: list[list[dict[str, Any]]] = [[] for _ in splits]
    for k in range(runs):
        for n, run in enumerate(splits):
            name = f"{run['tp']}x{run['prefill']}p{run['decode']}d"
            print(f"serving split {n + 1} of {len(splits)}: {name} (run {k + 1} of {runs})",
                  flush=True)  # fmt: skip
            serve = serve_args(args, run, profiles[run["tp"]])
            summary, _ = asyncio.run(served(Path(args.model), serve, flags, name))
            summaries[n].append(summary)
    rows = [{**measured_row(run, summaries[n]), "plan_rank": n + 1} for n, run in enumerate(splits)]
    by_served = sorted(
        rows, key=lambda r: (-r["measured"]["goodput"], r["measured"]["ttft_p99_ms"])
    )
    for rank, row in enumerate(by_served, 1):
        row["measured_rank"] = rank
    return {"splits": rows, "agrees": by_served[0]["plan_rank"] == 1}


def calibration_of(validation: dict[str, Any], source: str) -> Calibration:
    return Calibration.from_runs(
        [(r["model"], r["measured"]) for r in validation["splits"]], source
    )


def table(validation: dict[str, Any]) -> str:
    lines = ["| split (tp, P+D) | plan rank | served rank | within SLOs, planned / served | "
             "TTFT p50 / p99 ms, planned / served | TPOT p50 ms, planned / served |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in validation["splits"]:
        p, m = r["planned"], r["measured"]
        lines.append(
            f"| tp{r['tp']}, {r['prefill']}P+{r['decode']}D | {r['plan_rank']} | "
            f"{r['measured_rank']} | {p['goodput']:.2f} / {m['goodput']:.2f} | "
            f"{p['ttft_p50_ms']:,.0f} / {p['ttft_p99_ms']:,.0f} ; {m['ttft_p50_ms']:,.0f} / "
            f"{m['ttft_p99_ms']:,.0f} | {p['itl_p50_ms']:.1f} / {m['itl_p50_ms']:.1f} |"
        )
    return "\n".join(lines)
