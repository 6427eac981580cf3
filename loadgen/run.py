"""One measured run of `baton bench`: the workload's requests and their schedule, the load
against one server with /metrics scraped around it, and the table row that reports it.
Shared by a single-server run (loadgen/cli.py) and a comparison (loadgen/compare.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

import httpx

from loadgen.client import run_load, scrape_metrics
from loadgen.metrics import (
    SLO,
    RequestResult,
    scrape_by_label,
    scrape_by_labels,
    scrape_sum,
    summarize,
)
from loadgen.traces import TraceRequest

KV_SECONDS = "baton:kv_transfer_seconds_sum"
STEP_TOKENS = "baton:worker_step_tokens_total"
PULLED_TOKENS = "baton:prefix_pulled_tokens_total"
WORKER_HIT_RATE = "baton:prefix_cache_hit_rate"
STEPS = "baton:worker_steps_total"
STEP_SECONDS = "baton:worker_step_seconds_total"


async def measure(
    base_url: str, model: str, rate: float, requests: Sequence[TraceRequest],
    args: argparse.Namespace, label: str = "", results: list[RequestResult] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One run at one rate: scrape /metrics, send the load, scrape again, summarise; the
    per-request results are appended to `results` when given."""
    load_before = os.getloadavg()[0]
    before = await scrape_metrics(base_url)
    run = await run_load(
        base_url, model, requests, max_duration_s=args.duration,
        drain_timeout_s=args.drain_timeout, api_key=args.api_key,
        progress=not args.no_progress, label=label or f"{rate:g} req/s",
        grpc_target=getattr(args, "grpc", None),
    )  # fmt: skip
    after = await scrape_metrics(base_url)
    if results is not None:
        results.extend(run.results)
    kv_s = None
    worker_hits: dict[str, float] = {}
    computed = pulled = None
    workers: dict[str, dict[str, float]] = {}
    if before is not None and after is not None:
        workers = step_totals(after, before)
        kv_s = scrape_sum(after, KV_SECONDS) - scrape_sum(before, KV_SECONDS)
        worker_hits = scrape_by_label(after, WORKER_HIT_RATE, "worker")
        computed = _prompt_tokens_computed(after) - _prompt_tokens_computed(before)
        pulled = scrape_sum(after, PULLED_TOKENS) - scrape_sum(before, PULLED_TOKENS)
    summary = summarize(run.results, run.duration_s, SLO(args.ttft_slo, args.tpot_slo), kv_s)
    # Prompt tokens the workers computed during the run (every pool: a decode worker may
    # prefill), and those copied between prefill workers instead (prefix migration).
    summary["prompt_tokens_computed"] = computed
    summary["prompt_tokens_pulled"] = pulled
    # The machine's 1-minute load average around the run: other work on a shared box is
    # the first thing to check when two runs disagree.
    # Per worker, over the server's lifetime: in disaggregated mode `usage.cached_tokens`
    # counts the decode worker's hits (blocks not sent), the prefill workers' hits (tokens
    # not recomputed) show only here.
    summary["worker_prefix_hit_rate"] = worker_hits
    summary["workers"] = workers
    summary.update(rate=rate, num_not_sent=run.num_not_sent,
                   load_avg_1m=(load_before, os.getloadavg()[0]))  # fmt: skip
    return summary


async def metrics_after_steps(
    base_url: str, before: str, workers: str = "", timeout_s: float = 1.0
) -> str | None:
    """/metrics once the counters of a worker whose id starts with `workers` show a step
    past `before`: they reach the door with the workers' next reports, so a scrape right
    after a reply may not hold its steps yet. The last scrape if none shows one within
    `timeout_s`; None if /metrics fails."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = await scrape_metrics(base_url)
        if after is None or time.monotonic() >= deadline:
            return after
        totals = step_totals(after, before)
        if any(v.get("steps", 0.0) > 0 for w, v in totals.items() if w.startswith(workers)):
            return after
        await asyncio.sleep(0.02)


def step_totals(after: str, before: str) -> dict[str, dict[str, float]]:
    """Per served worker, over the run: busy seconds in engine steps, steps, decode rows and
    prefill tokens (its `baton:worker_step_*` counters), as the model counts its own, and
    the serving loop's seconds between steps (which the model does not count)."""

    def per(exposition: str) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        phases = scrape_by_labels(exposition, STEP_SECONDS, ("worker", "phase"))
        for (worker, phase), v in phases.items():
            w = out.setdefault(worker, {"busy_s": 0.0})
            if phase == "between":  # the serving loop's, between steps
                w["between_s"] = v
            elif phase != "attention":  # inside forward
                w["busy_s"] += v
        for worker, v in scrape_by_label(exposition, STEPS, "worker").items():
            out.setdefault(worker, {"busy_s": 0.0})["steps"] = v
        tokens = scrape_by_labels(exposition, STEP_TOKENS, ("worker", "kind"))
        for (worker, kind), v in tokens.items():
            key = {"decode": "decode_rows", "prefill": "prefill_tokens"}.get(kind)
            if key:
                out.setdefault(worker, {"busy_s": 0.0})[key] = v
        return out

    a, b = per(after), per(before)
    return {w: {k: v - b.get(w, {}).get(k, 0.0) for k, v in vals.items()} for w, vals in a.items()}


def _prompt_tokens_computed(exposition: str) -> float:
    by_kind = scrape_by_labels(exposition, STEP_TOKENS, ("worker", "kind"))
    return sum(v for (_, kind), v in by_kind.items() if kind == "prefill")


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
