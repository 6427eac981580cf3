"""Bursty load against static and autoscaled pools.

    python -m bench.serving.bursty                      # 3 configurations, ~5 minutes each
    python -m bench.serving.bursty --rate 2 --phase-s 90 --phases 6

The Azure conversation trace's prompt and output lengths (scaled to a CPU, as `baton bench
--workload azure`), arriving in alternating low / high phases (`--burst` x apart, 8 by
default) whose mean is `--rate`: Poisson within each phase. The same requests at the same
times go to three servers, one at a time:

  static-average  pools sized for the mean load (`--average-pools`, default 0P+1D)
  static-peak     pools sized for the peak (`--peak-pools`, default 0P+2D)
  autoscaled      the average pools with `--autoscale` between them and the peak pools

The defaults fit this kind of machine (two cores): one thread a worker, bound to a core of
its own (worker/cpu_claims.py), so a second worker is a second core, capacity that a third
or fourth would not add; decode workers prefill their own prompts (no prefill pool), and
the mean rate (2.5 req/s: 0.56 / 4.44) is under one worker's capacity and the peak over it.

Per configuration: the share of requests that met both SLOs (TTFT and time per output
token; `--ttft-slo`, `--itl-slo`), goodput (those per second), worker-seconds (the pools'
sizes from /metrics, sampled every second and integrated over the run), and requests lost
(sent but not completed: errors, refusals, timeouts). Writes bench/results/serving/bursty.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
from pathlib import Path
from typing import Any

from bench.paths import results_file
from bench.serving.pools import Samples, sample_pools, worker_seconds
from loadgen import workloads as wl
from loadgen.client import run_load
from loadgen.compare import LOGS, ensure_bench_model
from loadgen.metrics import SLO, RequestResult, summarize
from loadgen.run import served_model
from loadgen.server import ServerProcess
from loadgen.traces import DEFAULT_TRACE, TraceRequest

_SERVE = ["--threads", "1", "--max-num-seqs", "32"]


def bursty_arrivals(
    phases: int, mean_rate: float, burst: float, phase_s: float, seed: int
) -> list[float]:
    """Poisson arrivals over `phases` alternating low / high phases of `phase_s` seconds
    (low first), the high rate `burst` x the low one, their mean `mean_rate`."""
    low = 2 * mean_rate / (1 + burst)
    rng = random.Random(seed)
    times: list[float] = []
    for phase in range(phases):
        rate = low * (burst if phase % 2 else 1.0)
        t, end = phase * phase_s, (phase + 1) * phase_s
        while (t := t + rng.expovariate(rate)) < end:
            times.append(t)
    return times


def workload(args: argparse.Namespace, space: wl.TokenSpace) -> list[TraceRequest]:
    times = bursty_arrivals(args.phases, args.rate, args.burst, args.phase_s, args.seed)
    trace = wl.azure_trace(args.trace or DEFAULT_TRACE["azure"], space, limit=len(times),
                           max_output=args.max_output, seed=args.seed)  # fmt: skip
    pairs = zip(times, trace, strict=True)
    return [TraceRequest.of_prompt(t, r.prompt_token_ids, r.output_length) for t, r in pairs]


def configs(args: argparse.Namespace) -> dict[str, list[str]]:
    (ap, ad), (pp, pd) = args.average_pools, args.peak_pools
    slo = ["--ttft-slo", str(args.ttft_slo), "--itl-slo", str(args.itl_slo)]
    autoscale = ["--autoscale", *slo, "--min-prefill", str(ap), "--max-prefill", str(pp),
                 "--min-decode", str(ad), "--max-decode", str(pd), "--autoscale-interval", "1",
                 "--scale-up-cooldown", "5",
                 "--scale-down-cooldown", str(args.phase_s / 2)]  # fmt: skip
    return {
        "static-average": ["--prefill", str(ap), "--decode", str(ad), *_SERVE],
        "static-peak": ["--prefill", str(pp), "--decode", str(pd), *_SERVE],
        "autoscaled": ["--prefill", str(ap), "--decode", str(ad), *_SERVE, *autoscale],
    }


def met_by_phase(
    results: list[RequestResult], slo: SLO, phases: int, phase_s: float
) -> list[float | None]:
    """Per phase, the share of the requests sent in it that met both SLOs (None: none sent;
    a request sent after the last phase's end counts in it)."""
    counts = [[0, 0] for _ in range(phases)]  # sent, met
    for r in results:
        phase = counts[min(phases - 1, int(r.sent_s // phase_s))]
        phase[0] += 1
        phase[1] += slo.met_by(r)
    return [met / sent if sent else None for sent, met in counts]


async def run_config(
    name: str, serve_args: list[str], model_dir: Path, requests: list[TraceRequest],
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    log = LOGS / f"bursty_{name}.log"
    with ServerProcess([*serve_args, "--model", str(model_dir)], log) as server:
        model = await served_model(server.url)
        warm = wl.fixed_lengths(2, 16, 4, wl.TokenSpace(args.token_low, args.token_low + 1))
        await run_load(server.url, model, warm, progress=False)
        samples: Samples = []
        sampler = asyncio.create_task(sample_pools(server.url, samples))
        try:
            run = await run_load(server.url, model, requests,
                                 max_duration_s=args.phase_s * args.phases + 5,
                                 drain_timeout_s=args.drain_timeout, progress=False,
                                 label=name)  # fmt: skip
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
    slo = SLO(args.ttft_slo, args.itl_slo)
    summary = summarize(run.results, run.duration_s, slo, None)
    met = sum(1 for r in run.results if slo.met_by(r))
    lost = sum(1 for r in run.results if not r.ok) + run.num_not_sent
    ws = sum(worker_seconds(samples, run.duration_s).values())
    return {
        "config": name,
        "serve_args": serve_args,
        "requests": len(requests),
        "met_slo": met,
        "met_slo_share": met / len(requests),
        "met_slo_by_phase": met_by_phase(run.results, slo, args.phases, args.phase_s),
        "goodput_per_s": met / run.duration_s,
        "lost": lost,
        "duration_s": run.duration_s,
        "worker_seconds": ws,
        "mean_workers": ws / run.duration_s if run.duration_s else 0.0,
        "pool_samples": samples,
        "requests_seen": [(r.sent_s, r.ttft_s, r.tpot_s, r.ok) for r in run.results],
        "summary": summary,
        "load_avg_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pools = lambda s: tuple(int(v) for v in s.split(","))  # noqa: E731 - "P,D"
    p.add_argument("--model", default=None, help="default: the 20M bench model")
    p.add_argument("--trace", default=None, help="Azure conversation CSV (default: shared)")
    p.add_argument("--rate", type=float, default=2.5, help="mean arrivals per second")
    p.add_argument("--burst", type=float, default=8.0, help="high phase rate / low phase rate")
    p.add_argument("--phase-s", type=float, default=60.0)
    p.add_argument("--phases", type=int, default=4)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--ttft-slo", type=float, default=2.0)
    p.add_argument("--itl-slo", type=float, default=0.2, help="time per output token, s")
    p.add_argument("--average-pools", type=pools, default=(0, 1), metavar="P,D")
    p.add_argument("--peak-pools", type=pools, default=(0, 2), metavar="P,D")
    p.add_argument("--configs", default="static-average,static-peak,autoscaled")
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument("--token-low", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(results_file("serving", "bursty.json")))
    args = p.parse_args(argv)
    model_dir = ensure_bench_model(args.model)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    requests = workload(args, wl.TokenSpace(args.token_low + 1, vocab))
    runs = {}
    for name in args.configs.split(","):
        serve_args = configs(args)[name]
        runs[name] = asyncio.run(run_config(name, serve_args, model_dir, requests, args))
        r = runs[name]
        print(f"{name}: met both SLOs {r['met_slo_share']:.1%}, goodput "
              f"{r['goodput_per_s']:.2f}/s, {r['worker_seconds']:.0f} worker-s "
              f"(mean {r['mean_workers']:.2f}), lost {r['lost']}; met by phase "
              + " / ".join(f"{m:.0%}" if m is not None else "-" for m in r["met_slo_by_phase"]),
              flush=True)  # fmt: skip
        doc = {"args": {k: v for k, v in vars(args).items()}, "runs": runs}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
