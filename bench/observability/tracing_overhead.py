"""What exporting every request's trace costs the served throughput: `baton serve` (the bench
model, one prefill and one decode worker, a thread each) with tracing off and with
`--otlp-traces-endpoint` at `--otlp-traces-sample-ratio 1.0`, exporting to a real OTLP/gRPC
receiver in this process; the same fixed workload sent past saturation to each, a fresh
server per run, the arms alternating (off, on, on, off, ...) so drift falls on both alike.

    python -m bench.observability.tracing_overhead [--arms off on] [--pairs 3 --rate 8]

`--arms none off` measures the slow-request keeper alone (`--slow-requests 0` against the
default).

Prints a table; writes bench/results/observability/tracing_overhead.json with every run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from bench.paths import results_file
from loadgen import workloads as wl
from loadgen.compare import LOGS, ensure_bench_model, warm_up
from loadgen.run import measure, served_model
from loadgen.server import ServerProcess
from tests.support.otlp_receiver import OTLPReceiver

ARMS = {
    "none": ["--slow-requests", "0"],
    "off": [],
    "on": ["--otlp-traces-endpoint", "{endpoint}", "--otlp-traces-sample-ratio", "1.0"],
}
"""`none`: no span anywhere (the API's no-op tracer); `off`: the default, the door keeping
its slow requests, nothing exported; `on`: every trace exported."""


def _serve_args(model: Path, arm: str, endpoint: str) -> list[str]:
    args = ["--model", str(model), "--prefill", "1", "--decode", "1", "--threads", "1"]
    return args + [a.format(endpoint=endpoint) for a in ARMS[arm]]


async def _run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    model = await served_model(url)
    await warm_up(url, model, args)
    space = wl.TokenSpace(args.token_range[0] + 2, args.token_range[1])
    requests = wl.fixed_lengths(args.num_requests, args.input_len, args.output_len, space)
    timed = wl.with_poisson_arrivals(requests, args.rate, 0)
    return await measure(url, model, args.rate, timed, args, label=f"{args.rate:g} req/s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3, help="rounds of every arm, order alternating")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=["off", "on"])
    p.add_argument("--rate", type=float, default=8.0, help="past the bench model's saturation")
    p.add_argument("--num-requests", type=int, default=120)
    p.add_argument("--duration", type=float, default=40.0)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--model", default=None, help="default: the 20M bench model")
    p.add_argument("--out", default=str(results_file("observability", "tracing_overhead.json")))
    args = p.parse_args(argv)
    # What loadgen.run.measure reads of a `baton bench` namespace.
    args.drain_timeout, args.api_key, args.no_progress = 60.0, None, True
    args.ttft_slo, args.tpot_slo, args.token_range = 2.0, 0.1, (16, 1000)

    model = ensure_bench_model(args.model)
    receiver = OTLPReceiver().start()
    runs: list[dict[str, Any]] = []
    try:
        for pair in range(args.pairs):
            for arm in args.arms if pair % 2 == 0 else args.arms[::-1]:
                spans_before = len(receiver.spans)
                log = LOGS / f"tracing_overhead_{pair}_{arm}.log"
                with ServerProcess(_serve_args(model, arm, receiver.endpoint), log) as server:
                    summary = asyncio.run(_run(server.url, args))
                    time.sleep(1.0)  # the last batch of spans leaves within EXPORT_DELAY_MS
                summary.update(pair=pair, arm=arm, spans=len(receiver.spans) - spans_before)
                runs.append(summary)
                rate, tokens = summary["request_throughput"], summary["output_tokens_per_s"]
                print(f"pair {pair} {arm:>3}: {rate:.3f} req/s, {tokens:.1f} tok/s, "
                      f"{summary['spans']} spans")  # fmt: skip
    finally:
        receiver.stop()

    def median(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["arm"] == arm)

    result = {
        "machine": platform.processor() or platform.machine(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "runs": runs,
        "median_req_s": {arm: median(arm, "request_throughput") for arm in args.arms},
        "median_tok_s": {arm: median(arm, "output_tokens_per_s") for arm in args.arms},
    }
    base = result["median_req_s"][args.arms[0]]
    result["over_first_arm"] = {arm: r / base for arm, r in result["median_req_s"].items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("| tracing | completed req/s (median) | output tok/s (median) |")
    print("| --- | ---: | ---: |")
    for arm in args.arms:
        print(f"| {arm} | {result['median_req_s'][arm]:.3f} | {result['median_tok_s'][arm]:.1f} |")
    print(f"over {args.arms[0]}: {result['over_first_arm']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
