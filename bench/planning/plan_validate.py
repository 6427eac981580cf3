"""`baton plan` against the same requests run for real, in one command.

    python -m bench.planning.plan_validate        # profile, then serve and plan each workload
    python -m bench.planning.plan_validate \\
        --profile bench/results/planning/plan_validation_profile.json   # reuse a profile

Per workload, the same requests (`baton bench`'s workload flags, WORKLOADS below) go
through `baton plan`'s cluster model for one configuration and the profile, and for real
through `baton serve` in that configuration (1 prefill + 1 decode worker by default; a fresh
server each run, so no prefix is warm), `--repeat` times, measured by `baton bench`'s client.
It prints and writes (bench/results/planning/plan_validation.json) TTFT and time per output token at
p50 and p99, measured (the median run, and the runs' range: one run's p99 is its few slowest
requests) and predicted, and their ratio; the target is each within 15%. The JSON
also has each request measured beside its prediction, and each worker's busy time in engine
steps, measured (its step counters) beside the model's: where a prediction is off, these say
whether the work or its timing is.

The profile is measured first (`baton profile`, the SHAPES below) on this machine, unless
one is given; then the serving overhead on a first token (bench/planning/request_overhead.py, on a
fresh server of the same configuration at idle), which the plan adds to each TTFT. With
`--reprofile` each real run is predicted from a profile measured just before it (the JSON
then has each run's own prediction and ratio), for hosts whose speed drifts. With
`--calibrate-runs K`, K real runs of each workload come first and calibrate the plan
(planner/calibration.py, written beside the results); the `--repeat` runs after them are
compared with the calibrated plan, so no run is compared with a calibration it made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.paths import results_file
from bench.planning import host_cpu, request_overhead
from loadgen.compare import LOGS, ensure_bench_model
from loadgen.metrics import RequestResult
from loadgen.server import ServerProcess
from planner import plan as baton_plan
from planner.calibration import Calibration
from planner.validate import served

PROFILE_OUT = results_file("planning", "plan_validation_profile.json")
"""Where each run's `baton profile` goes (the profile the runs were predicted from)."""

WORKLOADS = {
    "azure": ["--workload", "azure", "--time-scale", "2", "--num-requests", "150",
              "--duration", "120"],
    "shared_prefix": ["--workload", "shared_prefix", "--rate", "2", "--num-requests", "120",
                      "--duration", "60", "--system-len", "1024", "--input-len", "128",
                      "--tenants", "4", "--output-len", "64"],
}  # fmt: skip
SHAPES = ["--lengths", "16", "64", "256", "512", "1024", "--batches", "1", "4", "8", "16", "32",
          "--contexts", "128", "512", "1024"]  # fmt: skip
METRICS = (("ttft", "ttft_s", "ttft"), ("tpot", "tpot_s", "itl"))
"""(name, `baton bench` summary key, `baton plan` key prefix): plan's ITL is the mean time per
output token after the first, per request, as the benchmark's TPOT."""


def profile(model_dir: Path, threads: int, out: Path) -> Path:
    cmd = [sys.executable, "-m", "router.cli", "profile", "--model", str(model_dir),
           "--threads", str(threads), *SHAPES, "--out", str(out)]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, timeout=1800)
    return out


def kv_blocks(profile_path: Path, kv_cache_gb: float, block_size: int = 16) -> int:
    """The KV blocks `baton serve --kv-cache-gb` gives a worker of this model."""
    per_token = json.loads(profile_path.read_text()).get("kv_bytes_per_token", 0)
    if not per_token:
        raise ValueError(f"{profile_path}: no kv_bytes_per_token; pass --kv-blocks")
    return int(kv_cache_gb * (1 << 30) // (per_token * block_size))


async def overhead(
    model_dir: Path, serve: list[str], disagg_min_uncached_tokens: int, prof: Path
) -> tuple[dict, dict]:
    """On a fresh server of the same configuration: the serving overhead on a first token at
    idle (bench/planning/request_overhead.py: `baton plan --request-overhead-ms`), then the serving
    work's CPU beside the engines (bench/planning/host_cpu.py: `baton plan --host-cpu`)."""
    with ServerProcess([*serve, "--model", str(model_dir)], LOGS / "plan_overhead.log") as server:
        first = await request_overhead.measure(
            server.url, local_tokens=max(16, disagg_min_uncached_tokens // 4),
            disagg_tokens=2 * max(disagg_min_uncached_tokens, 64),
        )  # fmt: skip
        cpu = await host_cpu.measure(
            server.url, prompt_tokens=max(16, disagg_min_uncached_tokens // 8), profile=prof,
            prefill_tokens=2 * max(disagg_min_uncached_tokens, 64),
        )  # fmt: skip
        return first, cpu


def calibrate(runs: list[dict[str, Any]], out: str, workload: str) -> Path:
    """The calibration (planner/calibration.py) the runs give the plan they were predicted
    from, written beside `out`; its path."""
    pairs = []
    for run in runs:
        measured = {f"{plan_key}_{q}_ms": run[bench_key][q] * 1000
                    for _, bench_key, plan_key in METRICS for q in ("p50", "p99")}  # fmt: skip
        pairs.append((run["predicted_ms"], measured))
    path = Path(out).with_name(f"{Path(out).stem}_calibration_{workload}.json")
    source = f"{len(runs)} served runs of {workload} (python -m bench.planning.plan_validate)"
    cal = Calibration.from_runs(pairs, source)
    cal.save(path)
    print(f"calibration from {len(runs)} runs: {cal.factors} -> {path}", flush=True)
    return path


def without(flags: list[str], drop: list[str]) -> list[str]:
    """`flags` less the run of them that is `drop` (a flag and its values)."""
    for i in range(len(flags) - len(drop) + 1):
        if flags[i : i + len(drop)] == drop:
            return flags[:i] + flags[i + len(drop) :]
    return list(flags)


def planned(profile_path: Path, pools: list[str], flags: list[str]) -> dict[str, Any]:
    args = baton_plan.build_arg_parser(argparse.ArgumentParser()).parse_args(
        ["--profile", str(profile_path), *pools, *flags]
    )
    return baton_plan.plan(args, keep_records=True)["pick"]


def per_request(results: list[RequestResult], records: list[dict[str, Any]]) -> list[dict]:
    """Measured and predicted side by side for each request (the same requests in the same
    order on both sides), to see which requests a model gets wrong, not only how much."""
    rows = []
    for r, p in zip(results, records, strict=False):
        tpot = r.tpot_s
        rows.append({
            "sent_s": round(r.sent_s, 3), "prompt_tokens": r.num_prompt_tokens,
            "output_tokens": r.num_output_tokens, "ok": r.ok,
            "ttft_ms": round(r.ttft_s * 1000, 1) if r.ttft_s is not None else None,
            "tpot_ms": round(tpot * 1000, 2) if tpot is not None else None,
            "predicted_ttft_ms": round(p["ttft_ms"], 1),
            "predicted_tpot_ms": round(p["itl_ms"], 2) if p.get("itl_ms") is not None else None,
            "predicted_on_decode": p.get("on_decode"),
        })  # fmt: skip
    return rows


def compare(measured: list[dict[str, Any]], predicted: dict[str, Any]) -> dict[str, Any]:
    """Each metric measured (the median over the runs, and the runs' range) against the
    prediction."""
    out: dict[str, Any] = {"measured_ms": {}, "measured_range_ms": {}, "predicted_ms": {},
                           "predicted_over_measured": {}}  # fmt: skip
    for name, bench_key, plan_key in METRICS:
        for q in ("p50", "p99"):
            values = [run[bench_key][q] * 1000 for run in measured]
            m = statistics.median(values)
            p = predicted[f"{plan_key}_{q}_ms"]
            key = f"{name}_{q}"
            out["measured_ms"][key] = m
            out["measured_range_ms"][key] = [min(values), max(values)]
            out["predicted_ms"][key] = p
            out["predicted_over_measured"][key] = round(p / m, 2) if m else None
            for name_out, field in (("per_run_predicted_over_measured", "predicted_ms"),
                                    ("per_run_without_host_over_measured",
                                     "predicted_ms_without_host")):  # fmt: skip
                out.setdefault(name_out, {})[key] = [
                    round(run[field][f"{plan_key}_{q}_ms"] / (run[bench_key][q] * 1000), 2)
                    for run in measured
                    if field in run
                ]
    return out


def table(runs: dict[str, dict[str, Any]]) -> str:
    lines = ["| workload | TTFT p50 / p99 ms, measured | predicted | TPOT p50 / p99 ms, "
             "measured | predicted | predicted / measured (TTFT p50, p99, TPOT p50, p99) |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for name, r in runs.items():
        m, p, q = r["measured_ms"], r["predicted_ms"], r["predicted_over_measured"]
        ratios = ", ".join(f"{q[k]:.2f}" for k in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99"))
        lines.append(
            f"| {name} | {m['ttft_p50']:,.0f} / {m['ttft_p99']:,.0f} | "
            f"{p['ttft_p50']:,.0f} / {p['ttft_p99']:,.0f} | {m['tpot_p50']:.1f} / "
            f"{m['tpot_p99']:.1f} | {p['tpot_p50']:.1f} / {p['tpot_p99']:.1f} | {ratios} |"
        )
    return "\n".join(lines)


def _relative(path: Path) -> str:
    """`path` from the repository root when it is inside it (results travel with the repo)."""
    root = Path(__file__).resolve().parents[2]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the 20M bench model")
    p.add_argument("--profile", default=None, help="a `baton profile` JSON (default: measure)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--prefill", type=int, default=1)
    p.add_argument("--decode", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--kv-cache-gb", type=float, default=1.0, help="per worker, as baton serve")
    p.add_argument("--disagg-min-uncached-tokens", type=int, default=256)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--repeat", type=int, default=3, help="real runs per workload (median)")
    p.add_argument("--calibrate-runs", type=int, default=0, metavar="K",
                   help="K more real runs per workload first, whose measured / planned "
                   "latencies calibrate the plan the --repeat runs are then compared with "
                   "(planner/calibration.py)")  # fmt: skip
    p.add_argument("--profile-out", default=str(PROFILE_OUT),
                   help="where a measured profile goes")  # fmt: skip
    p.add_argument("--reprofile", action="store_true",
                   help="measure the profile again before every real run and predict that "
                   "run from it (a host whose speed drifts)")  # fmt: skip
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="one more `baton serve` argument (repeat it; e.g. --serve-arg=--engine-nice"
                   " --serve-arg=-10)")  # fmt: skip
    p.add_argument("--no-host-model", action="store_true",
                   help="plan without `--host-cpu` (the engines never wait for a "
                   "core)")  # fmt: skip
    p.add_argument("--out", default=str(results_file("planning", "plan_validation.json")))
    args = p.parse_args(argv)
    model_dir = ensure_bench_model(args.model)
    profile_out = Path(args.profile_out)
    prof = Path(args.profile) if args.profile else profile(model_dir, args.threads, profile_out)
    blocks = kv_blocks(prof, args.kv_cache_gb)
    pools = ["--prefill", str(args.prefill), "--decode", str(args.decode)]
    common = ["--max-num-seqs", str(args.max_num_seqs),
              "--disagg-min-uncached-tokens", str(args.disagg_min_uncached_tokens)]  # fmt: skip
    serve = [*pools, *common, "--threads", str(args.threads), "--kv-cache-gb",
             str(args.kv_cache_gb), *args.serve_arg]  # fmt: skip
    over, cpu = asyncio.run(overhead(model_dir, serve, args.disagg_min_uncached_tokens, prof))
    print(f"request overhead: local {over['local_ms']:.1f} ms, through the prefill pool "
          f"{over['disagg_ms']:.1f} ms; serving CPU {cpu['base_cores']:.3f} cores at idle, "
          f"{cpu['request_ms']:.2f} ms a request, {cpu['token_ms']:.3f} ms a token, "
          f"{cpu['engine_share']:.2f} of it on the engine's core, an engine beside another "
          f"{1 + cpu['co_run']:.2f}x slower", flush=True)  # fmt: skip
    measured_overhead = [f"{over['local_ms']:.1f}", f"{over['disagg_ms']:.1f}"]
    plan_flags = [*pools, *common, "--kv-blocks", str(blocks), "--threads", str(args.threads),
                  "--request-overhead-ms", *measured_overhead]  # fmt: skip
    host_flags = host_cpu.plan_flags(cpu)
    if not args.no_host_model:
        plan_flags += host_flags
    runs: dict[str, dict[str, Any]] = {}
    for name in args.workloads.split(","):
        flags = WORKLOADS[name]
        measured, predictions, calibrating = [], [], []
        cal_flags: list[str] = []
        for i in range(args.calibrate_runs + args.repeat):
            if args.reprofile and (i or runs):  # the first run has the one just measured
                prof = profile(model_dir, args.threads, profile_out)
            if args.reprofile or i in (0, args.calibrate_runs):
                predicted = planned(prof, [*plan_flags, *cal_flags], flags)
                records, workers = predicted.pop("records"), predicted.pop("workers")
                # the same plan with the host's cores left out: what the host model changes
                unhosted = planned(prof, without(plan_flags, host_flags), flags)
            summary, results = asyncio.run(served(model_dir, serve, flags, f"{name}-{i}"))
            summary["requests"] = per_request(results, records)
            summary["predicted_workers"] = workers
            summary["predicted_ms"] = {k: v for k, v in predicted.items() if k.endswith("_ms")}
            summary["predicted_ms_without_host"] = {
                k: v for k, v in unhosted.items() if k.endswith("_ms")
            }
            if i < args.calibrate_runs:
                calibrating.append(summary)
                if i == args.calibrate_runs - 1:
                    cal_flags = ["--calibration", str(calibrate(calibrating, args.out, name))]
                continue
            measured.append(summary)
            predictions.append(predicted)
        predicted = {k: statistics.median(p[k] for p in predictions) for k in predictions[0]
                     if isinstance(predictions[0][k], (int, float))}  # fmt: skip
        runs[name] = {**compare(measured, predicted), "predicted": predicted,
                      "predicted_workers": workers, "measured": measured,
                      "calibration": cal_flags[1:], "calibration_runs": calibrating}  # fmt: skip
        print(table({name: runs[name]}).splitlines()[-1], flush=True)
    doc = {
        "what": "baton plan's prediction against the same requests run for real",
        "profile": _relative(prof),
        "commands": {
            "serve": "baton serve " + " ".join(serve),
            "plan": "baton plan --profile PROFILE " + " ".join(plan_flags),
            "workloads": {k: " ".join(v) for k, v in WORKLOADS.items()},
        },
        "request_overhead": over,
        "host_cpu": cpu,
        "cpus": os.cpu_count(),
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(table(runs))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
