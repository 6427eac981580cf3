"""`baton bench`: open-loop load against Baton's OpenAI front door, one server or a
side-by-side comparison of configurations it starts itself.

    # against a running server, a sweep of Poisson rates
    baton bench --url http://127.0.0.1:8000 --workload long_mix --rate 0.5 1 2
    # replay the Mooncake trace, its own arrival times compressed 4x
    baton bench --url http://127.0.0.1:8000 --workload mooncake --time-scale 0.25
    # start `baton serve` per configuration: unified vs disaggregated, cache-aware vs
    # round-robin routing; JSON + PNG into bench/results/
    baton bench --compare all --model /tmp/bench-model

Every run prints and writes TTFT / TPOT / ITL / e2e percentiles, throughput, goodput under
--ttft-slo / --tpot-slo, prefix hit rate, KV-transfer share and errors (bench/serve_metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench import serve_workloads as wl
from bench.serve_client import run_load, scrape_metrics
from bench.serve_metrics import SLO, scrape_by_label, scrape_sum, summarize

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
DEFAULT_TRACE = {
    "mooncake": TRACES / "mooncake" / "synthetic_trace.jsonl",
    "azure": TRACES / "azure" / "AzureLLMInferenceTrace_conv.csv",
}
WORKLOADS = ("fixed", "distributed", "shared_prefix", "multi_turn", "long_mix", "mooncake",
             "azure")  # fmt: skip
KV_SECONDS = "baton:kv_transfer_seconds_sum"
WORKER_HIT_RATE = "baton:prefix_cache_hit_rate"


def build_workload(args: argparse.Namespace, space: wl.TokenSpace) -> list[wl.BenchRequest]:
    """The workload's requests; arrival_s is the trace's own time (0 for synthetic ones)."""
    n, seed = args.num_requests, args.seed
    match args.workload:
        case "fixed":
            return wl.fixed_lengths(n, args.input_len, args.output_len, space, seed)
        case "distributed":
            return wl.distributed_lengths(
                n, args.input_len, args.output_len, space, args.spread, seed
            )
        case "shared_prefix":
            return wl.shared_prefix(
                n, space, num_tenants=args.tenants, system_tokens=args.system_len,
                user_tokens=args.input_len, output_len=args.output_len, seed=seed,
                prefix_seed=args.prefix_seed,
            )  # fmt: skip
        case "multi_turn":
            return wl.multi_turn(max(1, n // 4), space, max_output=args.output_len,
                                 seed=seed)[:n]  # fmt: skip
        case "long_mix":
            return wl.long_prompt_mix(n, space, long_fraction=args.long_fraction, seed=seed)
        case "mooncake":
            return wl.mooncake_trace(
                args.trace or DEFAULT_TRACE["mooncake"], space, limit=n,
                length_scale=args.length_scale or 1 / 32, max_output=args.max_output, seed=seed,
            )  # fmt: skip
        case "azure":
            return wl.azure_trace(
                args.trace or DEFAULT_TRACE["azure"], space, limit=n,
                length_scale=args.length_scale or 0.25, output_scale=args.output_scale,
                max_output=args.max_output, seed=seed,
            )  # fmt: skip
    raise ValueError(f"unknown workload {args.workload!r}; choose from {', '.join(WORKLOADS)}")


def schedules(
    args: argparse.Namespace, space: wl.TokenSpace
) -> list[tuple[float, list[wl.BenchRequest]]]:
    """(offered rate, timed requests) per run: Poisson at each of `args.rate`, or the
    trace's own arrivals scaled by `args.time_scale` (its rate is then what it offers).
    Each rate gets its own prompts (another seed, same shape): a run must not find the
    previous run's prompts in the prefix caches."""
    if not args.rate:
        timed = wl.retime(build_workload(args, space), args.time_scale)
        span = timed[-1].arrival_s if timed else 0.0
        return [(len(timed) / span if span > 0 else 0.0, timed)]
    runs = []
    for i, rate in enumerate(args.rate):
        seed = args.seed + 1000 * i
        requests = build_workload(argparse.Namespace(**{**vars(args), "seed": seed}), space)
        runs.append((rate, wl.with_poisson_arrivals(requests, rate, seed)))
    return runs


async def measure(
    base_url: str, model: str, rate: float, requests: Sequence[wl.BenchRequest],
    args: argparse.Namespace, label: str = "",
) -> dict[str, Any]:  # fmt: skip
    """One run at one rate: scrape /metrics, send the load, scrape again, summarise."""
    load_before = os.getloadavg()[0]
    before = await scrape_metrics(base_url)
    run = await run_load(
        base_url, model, requests, max_duration_s=args.duration,
        drain_timeout_s=args.drain_timeout, api_key=args.api_key,
        progress=not args.no_progress, label=label or f"{rate:g} req/s",
        grpc_target=getattr(args, "grpc", None),
    )  # fmt: skip
    after = await scrape_metrics(base_url)
    kv_s = None
    worker_hits: dict[str, float] = {}
    if before is not None and after is not None:
        kv_s = scrape_sum(after, KV_SECONDS) - scrape_sum(before, KV_SECONDS)
        worker_hits = scrape_by_label(after, WORKER_HIT_RATE, "worker")
    summary = summarize(run.results, run.duration_s, SLO(args.ttft_slo, args.tpot_slo), kv_s)
    # The machine's 1-minute load average around the run: other work on a shared box is
    # the first thing to check when two runs disagree.
    # Per worker, over the server's lifetime: in disaggregated mode `usage.cached_tokens`
    # counts the decode worker's hits (blocks not sent), the prefill workers' hits (tokens
    # not recomputed) show only here.
    summary["worker_prefix_hit_rate"] = worker_hits
    summary.update(rate=rate, num_not_sent=run.num_not_sent,
                   load_avg_1m=(load_before, os.getloadavg()[0]))  # fmt: skip
    return summary


async def served_model(base_url: str, api_key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10.0) as client:
        resp = await client.get("/v1/models")
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])


def format_row(name: str, s: dict[str, Any]) -> str:
    def ms(d: dict[str, Any], k: str) -> str:
        return f"{d[k] * 1000:8.0f}" if d[k] is not None else "       -"

    hit = s["prefix_hit_rate"]
    return (
        f"{name:<16} {s['rate']:6.2f} {s['num_ok']:4d}/{s['num_requests']:<4d}"
        f"{ms(s['ttft_s'], 'mean')}{ms(s['ttft_s'], 'p50')}{ms(s['ttft_s'], 'p99')}"
        f"{ms(s['tpot_s'], 'p50')}{ms(s['tpot_s'], 'p99')}{ms(s['itl_s'], 'p99')}"
        f"{ms(s['e2e_s'], 'p99')} {s['output_tokens_per_s']:7.1f} {s['request_throughput']:6.2f}"
        f" {s['goodput']:6.2f} {'-' if hit is None else f'{hit:5.2f}':>5}"
    )


HEADER = (
    f"{'config':<16} {'rate':>6} {'ok/sent':<9}{'TTFTavg':>8}{'TTFTp50':>8}{'TTFTp99':>8}"
    f"{'TPOTp50':>8}{'TPOTp99':>8}{'ITLp99':>8}{'e2ep99':>8} {'tok/s':>7} {'req/s':>6}"
    f" {'good':>6} {'hit':>5}   (times in ms)"
)


def _rates(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a request rate must be > 0, got {text}")
    return value


def build_arg_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server's HTTP front door")
    target.add_argument("--compare", choices=["all", "pd", "policy"],
                        help="start `baton serve` per configuration and compare them")  # fmt: skip
    p.add_argument(
        "--grpc",
        default=None,
        metavar="HOST:PORT",
        help="with --url: send the load to this gRPC front door instead (/metrics from --url)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="--compare: the checkpoint to serve (default: make the 20M bench model)",
    )
    p.add_argument("--workload", choices=WORKLOADS, default="long_mix")
    p.add_argument("--trace", default=None, help="trace file (mooncake JSONL / Azure CSV)")
    p.add_argument(
        "--rate",
        type=_rates,
        nargs="+",
        default=None,
        help="Poisson request rates (req/s) to sweep; none: the trace's own timing",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="trace-timed arrivals: multiply the trace's gaps by this",
    )
    p.add_argument("--num-requests", type=int, default=None, help="requests per rate")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds during which requests are sent, per rate",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds after --duration before in-flight requests are cancelled",
    )
    p.add_argument(
        "--input-len",
        type=int,
        default=128,
        help="prompt tokens (shared_prefix: the unique user part)",
    )
    p.add_argument("--output-len", type=int, default=64, help="output tokens")
    p.add_argument("--spread", type=float, default=0.5, help="distributed: +- fraction")
    p.add_argument("--system-len", type=int, default=1024, help="shared_prefix: tokens")
    p.add_argument("--tenants", type=int, default=8, help="shared_prefix: system prompts")
    p.add_argument("--long-fraction", type=float, default=0.15, help="long_mix: long share")
    p.add_argument(
        "--length-scale",
        type=float,
        default=None,
        help="traces: prompt length factor (mooncake 1/32, azure 0.25)",
    )
    p.add_argument("--output-scale", type=float, default=0.5, help="azure: output length factor")
    p.add_argument("--max-output", type=int, default=128, help="traces: cap on output tokens")
    p.add_argument("--ttft-slo", type=float, default=None, help="goodput TTFT target, s")
    p.add_argument("--tpot-slo", type=float, default=None, help="goodput TPOT target, s")
    p.add_argument(
        "--token-range",
        type=int,
        nargs=2,
        default=(16, 1000),
        metavar=("LOW", "HIGH"),
        help="prompt token ids are drawn from [LOW, HIGH)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--prefix-seed",
        type=int,
        default=0,
        help="shared_prefix: the tenants' system prompts (kept across rates)",
    )
    p.add_argument("--api-key", default=None)
    p.add_argument("--out", default=None, help="JSON results (default under bench/results/)")
    p.add_argument("--plot", default=None, help="PNG plot (default beside --out)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _fill_defaults(args: argparse.Namespace) -> None:
    args.num_requests = args.num_requests or 200
    args.duration = args.duration or 120.0
    args.ttft_slo = args.ttft_slo or 2.0
    args.tpot_slo = args.tpot_slo or 0.1


async def _bench_url(args: argparse.Namespace) -> dict[str, Any]:
    _fill_defaults(args)
    space = wl.TokenSpace(*args.token_range)
    model = await served_model(args.url, args.api_key)
    print(HEADER)
    summaries = []
    for rate, timed in schedules(args, space):
        s = await measure(args.url, model, rate, timed, args)
        print(format_row(args.workload, s), flush=True)
        summaries.append(s)
    return {"workload": args.workload, "url": args.url, "model": model, "runs": summaries}


def run_from_args(args: argparse.Namespace) -> int:
    if args.compare:
        from bench.serve_compare import run_comparison

        return run_comparison(args)
    result = asyncio.run(_bench_url(args))
    out = Path(args.out or f"bench/results/serve_{args.workload}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": _jsonable(args), **result}, indent=2))
    from bench.serve_plot import plot_experiment

    png = Path(args.plot) if args.plot else out.with_suffix(".png")
    plot_experiment(f"{args.workload} @ {args.url}", {args.workload: result["runs"]}, png)
    print(f"wrote {out} and {png}")
    return 0


def _jsonable(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if isinstance(v, str | int | float | list | tuple
                                                              | type(None))}  # fmt: skip


def register_command(sub: argparse._SubParsersAction) -> None:
    """`baton bench`: registered through the `baton.commands` entry point (pyproject.toml)."""
    bench = sub.add_parser("bench", help="open-loop load against a serving cluster")
    build_arg_parser(bench)
    bench.set_defaults(func=run_from_args)


def main(argv: list[str] | None = None) -> int:
    parser = build_arg_parser(argparse.ArgumentParser(prog="baton bench", description=__doc__))
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
