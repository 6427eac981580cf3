"""Two tenants of equal weight, one sending ten times the other's rate past saturation: with
the fair share, and first in first out, the same requests at the same times.

    python -m bench.serving.fair_share                    # ~5 minutes
    python -m bench.serving.fair_share --pools 0,1 --duration 30

Each tenant is its API key (the door's tenant is the key's hash: router/frontdoor/tenants.py).
The quiet tenant sends `--quiet-rate` req/s, the flooding one ten times that, Poisson, fresh
prompts of `--prompt-tokens` and `--output-tokens` each (nothing to reuse); the flood alone is
past what the pools serve, so a queue builds. Two servers, one at a time:

  fair-share   baton serve's default: the prefill gate and each engine serve the tenant
               served least first (core/fair_share.py)
  fifo         --no-fair-share: first in, first out

Per configuration and tenant: requests sent and completed, TTFT p50 / p99, the share within
the quiet tenant's TTFT SLO (`--ttft-slo`), output tokens per second. The claim: with the fair
share the quiet tenant's TTFT p99 is within its SLO and the flood gets the rest of the
throughput; first in, first out, the quiet tenant waits behind the flood's queue. Writes
bench/results/serving/fair_share.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
from pathlib import Path
from typing import Any

from bench.paths import results_file
from loadgen import workloads as wl
from loadgen.client import run_load
from loadgen.compare import LOGS, ensure_bench_model
from loadgen.metrics import RequestResult
from loadgen.run import served_model
from loadgen.server import ServerProcess
from loadgen.traces import TraceRequest

TENANTS = {"quiet": 1.0, "flood": 10.0}
"""Each tenant's rate, in multiples of --quiet-rate."""


def arrivals(
    rate: float, duration_s: float, args: argparse.Namespace, seed: int
) -> list[TraceRequest]:
    rng = random.Random(seed)
    space = wl.TokenSpace(args.token_low, args.token_low + 2000)
    out, t = [], 0.0
    while (t := t + rng.expovariate(rate)) < duration_s:
        prompt = [rng.randrange(space.low, space.high) for _ in range(args.prompt_tokens)]
        out.append(TraceRequest.of_prompt(t, prompt, args.output_tokens))
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def tenant_summary(results: list[RequestResult], sent: int, duration_s: float,
                   ttft_slo: float) -> dict[str, Any]:  # fmt: skip
    done = [r for r in results if r.ok and r.ttft_s is not None]
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    return {
        "sent": sent,
        "completed": len(done),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "within_ttft_slo": sum(1 for t in ttfts if t <= ttft_slo) / sent if sent else None,
        "output_tokens_per_s": sum(r.num_output_tokens for r in done) / duration_s,
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }


async def run_config(
    name: str,
    serve_args: list[str],
    model_dir: Path,
    load: dict[str, list[TraceRequest]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    with ServerProcess(
        [*serve_args, "--model", str(model_dir)], LOGS / f"fair_share_{name}.log"
    ) as server:
        model = await served_model(server.url)
        warm = wl.fixed_lengths(2, 16, 4, wl.TokenSpace(args.token_low, args.token_low + 1))
        await run_load(server.url, model, warm, progress=False)
        runs = await asyncio.gather(*(
            run_load(server.url, model, reqs, max_duration_s=args.duration + 5,
                     drain_timeout_s=args.drain_timeout, api_key=f"{tenant}-key",
                     progress=False, label=f"{name} {tenant}")
            for tenant, reqs in load.items()
        ))  # fmt: skip
    return {
        "config": name,
        "serve_args": serve_args,
        "tenants": {
            tenant: tenant_summary(run.results, len(load[tenant]), run.duration_s, args.ttft_slo)
            for tenant, run in zip(load, runs, strict=True)
        },
        "load_avg_1m": os.getloadavg()[0],
    }


def table(doc: dict[str, Any]) -> str:
    lines = [
        "| config | tenant | sent | completed | TTFT p50 / p99 s | within TTFT SLO | tok/s |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for run in doc["runs"]:
        for tenant, t in run["tenants"].items():
            p50, p99 = t["ttft_p50_s"], t["ttft_p99_s"]
            ttft = "-" if p50 is None else f"{p50:.2f} / {p99:.2f}"
            within = "-" if t["within_ttft_slo"] is None else f"{100 * t['within_ttft_slo']:.0f}%"
            row = [run["config"], tenant, t["sent"], t["completed"], ttft, within,
                   f"{t['output_tokens_per_s']:.1f}"]  # fmt: skip
            lines.append("| " + " | ".join(map(str, row)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the 20M bench model")
    p.add_argument("--pools", default="1,1", help="prefill,decode workers")
    p.add_argument("--quiet-rate", type=float, default=0.4, help="the quiet tenant's req/s")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--ttft-slo", type=float, default=2.0, help="the quiet tenant's, s")
    p.add_argument("--drain-timeout", type=float, default=120.0)
    p.add_argument("--configs", default="fair-share,fifo")
    p.add_argument("--token-low", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(results_file("serving", "fair_share.json")))
    args = p.parse_args(argv)
    prefill, decode = (int(x) for x in args.pools.split(","))
    serve = ["--prefill", str(prefill), "--decode", str(decode), "--threads", "1",
             "--max-num-seqs", "16", "--max-num-batched-tokens", "512"]  # fmt: skip
    configs = {"fair-share": serve, "fifo": [*serve, "--no-fair-share"]}
    chosen = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in configs]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(configs)})")
    load = {t: arrivals(args.quiet_rate * m, args.duration, args, args.seed + i)
            for i, (t, m) in enumerate(TENANTS.items())}  # fmt: skip
    model_dir = ensure_bench_model(args.model)
    runs = [asyncio.run(run_config(c, configs[c], model_dir, load, args)) for c in chosen]
    doc = {"args": vars(args), "tenants": TENANTS, "runs": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
