"""`baton bench --compare`: configurations side by side, on the same machine, in one run.

Three experiments, each one workload sent to each configuration at the same rates:
- `pd`: the long-prompt mix, `unified` (2 colocated workers) against disaggregated
  (1 prefill + 1 decode), every worker one torch thread, so both get the same cores.
- `policy`: the shared-prefix workload on 2 prefill workers + 1 decode worker, prefix-aware
  (`cache_aware`) against `round_robin` routing. The KV cache of each worker is sized to
  hold about half the tenants' system prompts: both workers' caches together hold them
  all only if the router keeps each tenant on one worker.
- `mooncake`: the Mooncake trace replayed at its own (compressed) timing on 4 prefill + 1
  decode workers with small caches: `ttft` with prefix migration against `cache_aware` and
  `round_robin`; prompt tokens computed (and pulled between prefill workers), TTFT.

Each configuration gets a fresh `baton serve` (stopped by PID at the end, even on errors).
Results: bench/results/serving/compare_<experiment>.json and .png; a verdict against the
experiment's targets (`verdict`) is printed and stored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen import workloads as wl
from loadgen.plot import plot_experiment, wrote
from loadgen.run import HEADER, format_row, measure, served_model
from loadgen.schedule import schedules
from loadgen.server import ServerProcess
from loadgen.traces import TraceRequest

RESULTS = Path("bench/results/serving")
"""Relative to the working directory: a checkout's results folder."""
LOGS = Path("/tmp/baton-bench-logs")
BENCH_MODEL = Path("/tmp/baton-bench-model-20m")
# ~20M parameters: a 1k-token prefill takes ~1 s on one CPU thread, long enough for prefill
# interference with decode to show, small enough for a 15-minute comparison.
BENCH_MODEL_SIZE = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 1536,
    "vocab_size": 4096,
}


@dataclass(frozen=True)
class Config:
    name: str
    serve_args: list[str]


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    workload: dict[str, Any]
    """loadgen.cli argument values for this experiment's workload."""
    configs: list[Config]
    rates: list[float]
    num_requests: int
    duration_s: float
    ttft_slo_s: float
    tpot_slo_s: float
    warm_tenants: bool = False
    """Send each tenant's system prompt once before measuring: the steady state of a
    service whose system prompts are long-lived, not a sweep of cold starts."""


_ONE_THREAD = "--threads 1 --max-num-seqs 32"
EXPERIMENTS = {
    "pd": Experiment(
        name="pd",
        title="long-prompt mix: unified (2 workers) vs disaggregated (1P + 1D), 1 thread each",
        workload={"workload": "long_mix", "long_fraction": 0.15},
        configs=[
            Config(
                "unified",
                f"--mode unified --prefill 1 --decode 1 --kv-cache-gb 0.25 {_ONE_THREAD}".split(),
            ),
            Config(
                "disaggregated",
                f"--mode disaggregated --prefill 1 --decode 1 --kv-cache-gb 0.25 "
                f"{_ONE_THREAD}".split(),
            ),
        ],
        rates=[1.0, 2.0, 2.5],
        num_requests=80,
        duration_s=40.0,
        ttft_slo_s=5.0,
        tpot_slo_s=0.075,
    ),
    "policy": Experiment(
        name="policy",
        title="shared prefix, 12 tenants x 2048-token system prompt, 2 prefill + 1 decode workers",
        workload={
            "workload": "shared_prefix",
            "tenants": 12,
            "system_len": 2048,
            "input_len": 256,
            "output_len": 16,
        },
        configs=[
            Config(
                policy,
                f"--mode disaggregated --prefill 2 --decode 1 --policy {policy} "
                f"--kv-cache-gb 0.25 {_ONE_THREAD}".split(),
            )
            for policy in ("cache_aware", "round_robin")
        ],
        rates=[0.5, 1.0],
        num_requests=80,
        duration_s=50.0,
        ttft_slo_s=5.0,
        tpot_slo_s=0.075,
        warm_tenants=True,
    ),
    "mooncake": Experiment(
        name="mooncake",
        title="Mooncake trace (1/32 lengths), 4 prefill + 1 decode workers, small caches",
        workload={"workload": "mooncake", "max_output": 16},  # --time-scale: its clock
        configs=[
            Config(
                name,
                # Every prompt through the prefill pool: the routing policy is what is compared
                # (with the default threshold half the trace's prompts, the short ones and
                # those the decode worker caches, never reach a prefill worker).
                f"--mode disaggregated --prefill 4 --decode 1 --policy {policy} "
                f"--disagg-min-uncached-tokens 0 --kv-cache-gb 0.04 {_ONE_THREAD}".split(),
            )
            for name, policy in (
                ("ttft_pull", "ttft --prefix-pull-gbps 2"),
                ("cache_aware", "cache_aware"),
                ("round_robin", "round_robin"),
                # routed when a prefill worker has room, not on arrival
                ("ttft_pull_late", "ttft --prefix-pull-gbps 2 --late-binding"),
                ("cache_aware_late", "cache_aware --late-binding"),
                # the bounded-load slack before the simulator's sweeps tightened it to 0.2
                ("ttft_pull_slack025", "ttft --prefix-pull-gbps 2 --balance-slack 0.25"),
                # the prefill gate first in, first out, before it let a longer cached prefix go
                # first (router.cluster.prefill_gate)
                ("ttft_pull_fifo", "ttft --prefix-pull-gbps 2 --gate-max-skips 0"),
                ("cache_aware_fifo", "cache_aware --gate-max-skips 0"),
            )
        ],
        rates=[],  # the trace's own arrivals
        num_requests=200,
        duration_s=240.0,
        ttft_slo_s=5.0,
        tpot_slo_s=0.2,
    ),
}


def ensure_bench_model(model: str | None) -> Path:
    if model:
        return Path(model)
    if not (BENCH_MODEL / "config.json").exists():
        from engine.tiny_model import make_tiny_model

        make_tiny_model(BENCH_MODEL, arch="llama", **BENCH_MODEL_SIZE)
    return BENCH_MODEL


def _vocab_high(model_dir: Path) -> int:
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    return int(vocab)


async def warm_up(url: str, model: str, args: argparse.Namespace) -> None:
    """Two short requests with tokens no workload uses, so first-call costs (allocations,
    connection set-up) stay out of the first rate's numbers without warming any prefix."""
    space = wl.TokenSpace(args.token_range[0], args.token_range[0] + 1)
    reqs = wl.fixed_lengths(2, 16, 4, space)
    await measure(url, model, 1.0, wl.with_poisson_arrivals(reqs, 4.0, 0), args, "warm-up")


async def _warm_tenants(
    url: str, model: str, args: argparse.Namespace, space: wl.TokenSpace
) -> None:
    prefixes = wl.tenant_prefixes(space, args.tenants, args.system_len, args.prefix_seed)
    rng = random.Random(-1)
    reqs = [
        TraceRequest.of_prompt(i * 1.0, p + [space.low + rng.randrange(space.high - space.low)
                                      for _ in range(args.input_len)], 1)
        for i, p in enumerate(prefixes)
    ]  # fmt: skip
    await measure(url, model, 1.0, reqs, args, "tenant warm-up")


async def _run_config(
    exp: Experiment, config: Config, model_dir: Path, args: argparse.Namespace,
    space: wl.TokenSpace,
) -> list[dict[str, Any]]:  # fmt: skip
    log = LOGS / f"serve_{exp.name}_{config.name}.log"
    summaries = []
    started = time.monotonic()
    with ServerProcess([*config.serve_args, "--model", str(model_dir)], log) as server:
        print(
            f"[{exp.name}] {config.name}: serving in {time.monotonic() - started:.0f} s "
            f"(pid {server.proc.pid if server.proc else '?'}, {server.url})",
            flush=True,
        )
        model = await served_model(server.url)
        await warm_up(server.url, model, args)
        if exp.warm_tenants:
            await _warm_tenants(server.url, model, args, space)
        for rate, timed in schedules(args, space):
            s = await measure(server.url, model, rate, timed, args, f"{config.name} {rate:g}/s")
            print(format_row(config.name, s), flush=True)
            summaries.append(s)
    return summaries


def verdict(exp: Experiment, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The experiment's targets, computed from the measured runs. `pd`: at the highest rate
    unified sustains, its p99 TPOT >= 2x disaggregated's and disaggregated's goodput >= 1.5x
    unified's; `policy`: round robin's mean TTFT >= 3x cache-aware's at each rate;
    `mooncake`: each configuration's prompt tokens computed and pulled, and its TTFT."""
    if exp.name == "pd":
        uni, dis = runs.get("unified", []), runs.get("disaggregated", [])
        sustained = [s for s in uni if sustains(s)]
        at = max(sustained or uni[:1], key=lambda s: s["rate"], default=None)
        other = next((s for s in dis if at and s["rate"] == at["rate"]), None)
        if at is None or other is None:
            return {"error": "missing runs"}
        tpot_ratio = _ratio(at["tpot_s"]["p99"], other["tpot_s"]["p99"])
        good_ratio = _ratio(other["goodput"], at["goodput"])
        return {
            "rate": at["rate"],
            "unified_sustains_rate": bool(sustained),
            "p99_tpot_unified_over_disagg": tpot_ratio,
            "goodput_disagg_over_unified": good_ratio,
            "target_tpot_met": tpot_ratio is not None and tpot_ratio >= 2.0,
            "target_goodput_met": good_ratio is not None and good_ratio >= 1.5,
        }
    if exp.name == "mooncake":
        return {
            name: {
                "prompt_tokens_computed": r[0].get("prompt_tokens_computed"),
                "prompt_tokens_pulled": r[0].get("prompt_tokens_pulled"),
                "ttft_mean_s": r[0]["ttft_s"]["mean"],
                "ttft_p99_s": r[0]["ttft_s"]["p99"],
                "num_errors": r[0]["num_errors"],
            }
            for name, r in runs.items()
            if r
        }
    ca, rr = runs.get("cache_aware", []), runs.get("round_robin", [])
    per_rate = []
    for a in ca:
        b = next((s for s in rr if s["rate"] == a["rate"]), None)
        if b is not None:
            ratio = _ratio(b["ttft_s"]["mean"], a["ttft_s"]["mean"])
            per_rate.append({"rate": a["rate"], "mean_ttft_rr_over_ca": ratio,
                             "target_met": ratio is not None and ratio >= 3.0})  # fmt: skip
    return {"per_rate": per_rate}


def sustains(s: dict[str, Any]) -> bool:
    """A configuration sustains a rate when every request completes and the median TTFT
    stays within the TTFT target: past capacity the queue grows for the whole run and the
    median TTFT with it. Tail latency and TPOT are not part of it: meeting those targets is
    goodput's question, and a rate unified keeps up with while missing them is the one the
    comparison is about."""
    p50 = s["ttft_s"]["p50"]
    return s["num_errors"] == 0 and p50 is not None and p50 <= s["slo"]["ttft_s"]


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def _exit_on_sigterm() -> None:
    """SIGTERM (a CI timeout, `kill PID`) unwinds like Ctrl-C, so each ServerProcess's exit
    stops its server instead of leaving it and its Ray cluster running."""

    def handler(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def run_comparison(args: argparse.Namespace) -> int:
    _exit_on_sigterm()
    model_dir = ensure_bench_model(args.model)
    names = list(EXPERIMENTS) if args.compare == "all" else [args.compare]
    for name in names:
        exp = EXPERIMENTS[name]
        exp_args = argparse.Namespace(**{**vars(args), **exp.workload})
        exp_args.num_requests = args.num_requests or exp.num_requests
        exp_args.duration = args.duration or exp.duration_s
        exp_args.ttft_slo = args.ttft_slo or exp.ttft_slo_s
        exp_args.tpot_slo = args.tpot_slo or exp.tpot_slo_s
        high = min(args.token_range[1], _vocab_high(model_dir))
        space = wl.TokenSpace(args.token_range[0], high)
        if args.rate is None:  # a trace experiment has no rates: the trace's own timing
            exp_args.rate = exp.rates
        print(f"\n== {exp.title}\n{HEADER}", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {}
        out = Path(args.out) if args.out and len(names) == 1 else RESULTS / f"compare_{name}.json"
        configs = chosen_configs(exp, args.configs)
        for config in configs:
            runs[config.name] = asyncio.run(_run_config(exp, config, model_dir, exp_args, space))
            _write(out, exp, configs, exp_args, model_dir, runs, None)
        v = verdict(exp, runs)
        _write(out, exp, configs, exp_args, model_dir, runs, v)
        png = plot_experiment(exp.title, runs, out.with_suffix(".png"))
        print(f"verdict: {json.dumps(v)}\n{wrote(out, png)}", flush=True)
    return 0


def chosen_configs(exp: Experiment, names: str | None) -> list[Config]:
    """The experiment's configurations named in `names` (comma-separated; None: all)."""
    if not names:
        return list(exp.configs)
    wanted = names.split(",")
    known = {c.name: c for c in exp.configs}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"--configs: {exp.name} has no {unknown} (it has {list(known)})")
    return [known[n] for n in wanted]


def _write(
    out: Path, exp: Experiment, configs: list[Config], args: argparse.Namespace,
    model_dir: Path, runs: dict[str, list[dict[str, Any]]], v: dict[str, Any] | None,
) -> None:  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "experiment": exp.name,
        "title": exp.title,
        "model": str(model_dir),
        "workload": exp.workload,
        "configs": {c.name: c.serve_args for c in configs},
        "num_requests": args.num_requests,
        "duration_s": args.duration,
        "slo": {"ttft_s": args.ttft_slo, "tpot_s": args.tpot_slo},
        "runs": runs,
        "verdict": v,
    }
    out.write_text(json.dumps(doc, indent=2))
