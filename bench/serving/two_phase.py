"""Long prompts, then long outputs, against the minimum pools and the autoscaler over both.

    python -m bench.serving.two_phase                   # 2 configurations, ~4 minutes each
    python -m bench.serving.two_phase --configs autoscaled --scale 0.5
    python -m bench.serving.two_phase --load 1.5    # the rates x 1.5 (the Xeon AMX's runs)

Four phases, Poisson arrivals within each (`--scale` stretches their lengths, `--load`
multiplies their rates):

  long prompts   prompts of 640-1152 tokens, 8-16-token outputs: more than one prefill
                 worker computes, the prefill pool must grow
  quiet          short prompts and outputs, a trickle: the pools drain
  long outputs   64-128-token prompts (prefilled on decode: under
                 --disagg-min-uncached-tokens), 192-320-token outputs: the running batch
                 passes one decode worker's slots, the decode pool must grow
  quiet

The same requests at the same times go to each configuration's server, one at a time:

  static-min               the autoscaler's minimum pools, fixed (1P+1D)
  autoscaled               --autoscale for both pools, between 1P+1D and 2P+2D
  autoscaled-overflow      the same with --prefill-overflow-s (`--configs` to run it)

The last routes with --prefill-overflow-s (a third of the TTFT SLO unless given): while the
prefill pool is backed up, by a burst of long prompts or while its second worker starts, the
decode worker prefills the prompts it would start sooner (router/routing/overflow.py). Its
long prompts slow that worker's decode steps, so ITL p90 grows the decode pool too; on the
Xeon AMX it met as many requests as the same pools without it, over a wider spread of runs
(docs/performance.md).

The sizes fit this kind of machine (two cores, one thread a worker): the minimum is a core
per pool. The rates are set for AVX2 cores (an AMD EPYC's), where the minimum pools fall
behind in the long prompts; cores with AMX (a Xeon's) prefill several times faster and keep
up with them there, and `--load` multiplies the rates. In the first phase the decode worker
is nearly idle, so a second prefill worker adds most of a core; in the second the prefill
worker is idle (short prompts are prefilled on decode) and a second decode worker takes its
core. The workers are not bound to cores (--no-cpu-bind): a binding by claim count
(worker/cpu_claims.py) put the second prefill worker on the first one's core, beside the
idle decode worker's, and the kernel moves busy threads to the idle core. A prefill pool of
0..1 would leave the long prompts to the decode worker until the prefill worker is up, and
that queue grows the decode pool too (its queue-wait term): three workers on two cores, the
prefill worker beside a busy one.

Per configuration and phase: the share of requests (by send time) within both SLOs (TTFT and
time per output token; `--ttft-slo`, `--itl-slo`), goodput (those per second); the pools'
sizes from /metrics each second and their worker-seconds; the autoscaler's decisions that
changed a pool, with the inputs each was made from (the admin API's history); requests lost
(sent but not completed). Writes bench/results/serving/two_phase.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.paths import results_file
from bench.serving.pools import sample_pools, worker_seconds
from loadgen import workloads as wl
from loadgen.client import run_load
from loadgen.compare import LOGS, ensure_bench_model
from loadgen.metrics import SLO, RequestResult, summarize
from loadgen.run import served_model
from loadgen.server import ServerProcess
from loadgen.traces import TraceRequest

_SERVE = ["--threads", "1", "--max-num-seqs", "16", "--no-cpu-bind"]


@dataclass(frozen=True)
class Phase:
    name: str
    duration_s: float
    rate: float
    """Arrivals per second."""
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]


PHASES = (
    Phase("long prompts", 60.0, 0.8, (640, 1152), (8, 16)),
    Phase("quiet", 35.0, 0.3, (32, 96), (16, 32)),
    Phase("long outputs", 60.0, 1.3, (64, 128), (192, 320)),
    Phase("quiet", 20.0, 0.3, (32, 96), (16, 32)),
)


def phases(scale: float, load: float = 1.0) -> list[Phase]:
    return [
        Phase(**{**asdict(p), "duration_s": p.duration_s * scale, "rate": p.rate * load})
        for p in PHASES
    ]


def workload(plan: list[Phase], space: wl.TokenSpace, seed: int) -> list[TraceRequest]:
    """Every phase's Poisson arrivals, each request a fresh prompt (no prefix to reuse)."""
    rng = random.Random(seed)
    out, start = [], 0.0
    for p in plan:
        t = start
        while (t := t + rng.expovariate(p.rate)) < start + p.duration_s:
            prompt = [
                rng.randrange(space.low, space.high) for _ in range(rng.randint(*p.prompt_tokens))
            ]
            out.append(TraceRequest.of_prompt(t, prompt, rng.randint(*p.output_tokens)))
        start += p.duration_s
    return out


def configs(args: argparse.Namespace) -> dict[str, list[str]]:
    slo = ["--ttft-slo", str(args.ttft_slo), "--itl-slo", str(args.itl_slo)]
    autoscale = ["--autoscale", *slo, "--min-prefill", "1", "--max-prefill", "2",
                 "--min-decode", "1", "--max-decode", "2", "--autoscale-interval", "1",
                 "--scale-up-cooldown", "5",
                 "--scale-down-cooldown", str(args.down_cooldown)]  # fmt: skip
    overflow_s = args.ttft_slo / 3 if args.prefill_overflow_s is None else args.prefill_overflow_s
    overflow = ["--prefill-overflow-s", str(overflow_s)]
    return {
        "static-min": ["--prefill", "1", "--decode", "1", *_SERVE],
        "autoscaled": ["--prefill", "1", "--decode", "1", *_SERVE, *autoscale],
        "autoscaled-overflow": ["--prefill", "1", "--decode", "1", *_SERVE, *autoscale, *overflow],
    }


def by_phase(results: list[RequestResult], slo: SLO, plan: list[Phase]) -> list[dict[str, Any]]:
    """Per phase (by send time; one sent after the last phase's end counts in it): requests
    sent, the share within both SLOs, and those per second of the phase."""
    ends = [sum(p.duration_s for p in plan[: i + 1]) for i in range(len(plan))]
    counts = [[0, 0] for _ in plan]  # sent, met
    for r in results:
        i = next((i for i, end in enumerate(ends) if r.sent_s < end), len(plan) - 1)
        counts[i][0] += 1
        counts[i][1] += slo.met_by(r)
    return [
        {"phase": p.name, "sent": sent, "met_slo_share": met / sent if sent else None,
         "goodput_per_s": met / p.duration_s}
        for p, (sent, met) in zip(plan, counts, strict=True)
    ]  # fmt: skip


async def autoscale_history(url: str, token: str, started: float) -> list[dict[str, Any]]:
    """The autoscaler's decisions that changed a pool (the admin API's history, the last
    50), each `at` seconds since the load started, with its inputs."""
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        resp = await client.get("/admin/api/state", headers={"Authorization": f"Bearer {token}"})
    resp.raise_for_status()
    return [
        {"at_s": round(d["at"] - started, 1), "pool": d["pool"], "size": d["size"],
         "target": d["target"], "reason": d["reason"], "pressure": round(d["pressure"], 2),
         "terms": {k: round(v, 2) for k, v in d["terms"].items()}, "signals": d["signals"],
         "capacity_per_worker": d["capacity_per_worker"]}
        for d in resp.json().get("autoscale_history", [])
    ]  # fmt: skip


async def run_config(
    name: str, serve_args: list[str], model_dir: Path, requests: list[TraceRequest],
    plan: list[Phase], args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    log = LOGS / f"two_phase_{name}.log"
    token = secrets.token_urlsafe(16)
    serve = [*serve_args, "--model", str(model_dir), "--admin-token", token]
    total_s = sum(p.duration_s for p in plan)
    with ServerProcess(serve, log) as server:
        model = await served_model(server.url)
        warm = wl.fixed_lengths(2, 16, 4, wl.TokenSpace(args.token_low, args.token_low + 1))
        await run_load(server.url, model, warm, progress=False)
        samples: list[tuple[float, dict[str, int]]] = []
        sampler = asyncio.create_task(sample_pools(server.url, samples))
        started = time.time()
        try:
            run = await run_load(server.url, model, requests, max_duration_s=total_s + 5,
                                 drain_timeout_s=args.drain_timeout, progress=False,
                                 label=name)  # fmt: skip
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        history = await autoscale_history(server.url, token, started)
    slo = SLO(args.ttft_slo, args.itl_slo)
    met = sum(1 for r in run.results if slo.met_by(r))
    ws = worker_seconds(samples, run.duration_s)
    return {
        "config": name,
        "serve_args": serve_args,
        "requests": len(requests),
        "met_slo": met,
        "met_slo_share": met / len(requests),
        "phases": by_phase(run.results, slo, plan),
        "goodput_per_s": met / run.duration_s,
        "lost": sum(1 for r in run.results if not r.ok) + run.num_not_sent,
        "duration_s": run.duration_s,
        "worker_seconds": ws,
        "pool_changes": {
            pool: sum(1 for d in history if d["pool"] == pool) for pool in ("prefill", "decode")
        },
        "autoscale_history": history,
        "pool_samples": samples,
        "requests_seen": [(r.sent_s, r.ttft_s, r.tpot_s, r.ok) for r in run.results],
        "summary": summarize(run.results, run.duration_s, slo, None),
        "load_avg_1m": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the 20M bench model")
    p.add_argument("--scale", type=float, default=1.0, help="phase lengths x this")
    p.add_argument("--load", type=float, default=1.0, help="arrival rates x this")
    p.add_argument("--ttft-slo", type=float, default=3.0)
    p.add_argument("--itl-slo", type=float, default=0.15, help="time per output token, s")
    p.add_argument("--down-cooldown", type=float, default=20.0, help="scale-down cooldown, s")
    p.add_argument(
        "--prefill-overflow-s",
        type=float,
        default=None,
        help="autoscaled-overflow's --prefill-overflow-s (default: a third of the TTFT SLO)",
    )
    p.add_argument("--configs", default="static-min,autoscaled")
    p.add_argument("--drain-timeout", type=float, default=90.0)
    p.add_argument("--token-low", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(results_file("serving", "two_phase.json")))
    args = p.parse_args(argv)
    model_dir = ensure_bench_model(args.model)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    plan = phases(args.scale, args.load)
    requests = workload(plan, wl.TokenSpace(args.token_low + 1, vocab), args.seed)
    runs = {}
    for name in args.configs.split(","):
        runs[name] = r = asyncio.run(
            run_config(name, configs(args)[name], model_dir, requests, plan, args)
        )
        print(f"{name}: within both SLOs {r['met_slo_share']:.1%}, goodput "
              f"{r['goodput_per_s']:.2f}/s, worker-s {r['worker_seconds']}, lost {r['lost']}, "
              f"pool changes {r['pool_changes']}; by phase "
              + " / ".join(f"{x['met_slo_share']:.0%}" if x["met_slo_share"] is not None
                           else "-" for x in r["phases"]),
              flush=True)  # fmt: skip
        doc = {"args": vars(args), "phases": [asdict(ph) for ph in plan], "runs": runs}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
