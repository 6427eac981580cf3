"""What a run sends: the workload flags `baton bench` and `baton plan` share, and the timed
requests they make, so a plan replays exactly the requests a benchmark sends."""

from __future__ import annotations

import argparse

from loadgen import workloads as wl
from loadgen.traces import DEFAULT_TRACE, TraceRequest

WORKLOADS = ("fixed", "distributed", "shared_prefix", "multi_turn", "long_mix", "mooncake",
             "azure")  # fmt: skip


def _rates(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a request rate must be > 0, got {text}")
    return value


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """What to send and when."""
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


def fill_workload_defaults(args: argparse.Namespace) -> None:
    """The defaults `baton bench` and `baton plan` share where a flag was left out."""
    args.num_requests = args.num_requests or 200
    args.duration = args.duration or 120.0
    args.ttft_slo = args.ttft_slo or 2.0
    args.tpot_slo = args.tpot_slo or 0.1


def build_workload(args: argparse.Namespace, space: wl.TokenSpace) -> list[TraceRequest]:
    """The workload's requests, arriving at the trace's own times (0 for synthetic ones)."""
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
) -> list[tuple[float, list[TraceRequest]]]:
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
