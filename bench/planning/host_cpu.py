"""The serving work's CPU on a running cluster, beside its engines: what `baton plan
--host-cpu CORES BASE REQUEST_MS TOKEN_MS SHARE CO_RUN` takes (planner/sim/host.py).

    python -m bench.planning.host_cpu --url http://127.0.0.1:8000 --profile worker_profile.json

Run on the host that serves (it reads the host's /proc/stat), nothing else running there; the
client's own CPU counts, as it does when a benchmark's client shares the host. Three phases,
each timed by the host's busy CPU (user, nice, system, interrupts: /proc/stat) less the
engine seconds the workers' `baton:worker_step_seconds_total` gained (their steps and the
serving loop's time between them):

- idle: nothing sent for `--idle-s` (half before the load, half after): Ray's and the
  door's own loops (BASE, in cores);
- requests: short prompts, one output token each (REQUEST_MS per request, less BASE);
- tokens: the same prompts with `--tokens` output tokens each (TOKEN_MS per output token,
  less BASE and the requests' share).

Prompts are short enough for the decode worker to prefill them, so the prefill pool stays idle
and one engine steps with a core free beside it. Given the worker's `baton profile`
(`--profile`), the tokens phase also gives SHARE: its decode steps took longer than the
profile prices them (1.21x here), though a core was free, because part of the serving work
ran on the engine's core; SHARE is the part that did (planner/sim/host.py). Last, where
the cluster has a prefill pool, the same long prompts prefilled alone and then beside a
decoding engine (rows on `context_tokens` of cached context each: the memory a loaded decode
reads), in alternating rounds, give CO_RUN: how much slower an engine steps with another
stepping on the other cores (the prefill pool's median seconds a prompt; measured here
1.18-1.44x beyond what the serving work's share explains). Each figure moves from one probe
to the next on a shared VM (docs/performance.md, "`baton plan` with the host's cores").
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from core.perf import DecodeProfile, WorkerProfile
from loadgen.client import scrape_metrics, stream_completion
from loadgen.metrics import RequestResult
from loadgen.run import served_model, step_totals
from loadgen.traces import TraceRequest
from planner.sim.host import HostCPU

_BUSY = (0, 1, 2, 5, 6)
"""/proc/stat's cpu line: user, nice, system, irq, softirq (idle, iowait and steal are not
this host's work)."""


def host_busy_s(stat: str | None = None) -> float:
    """Seconds of CPU the host's cores spent busy since boot."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    fields = text.split("\n", 1)[0].split()
    if fields[0] != "cpu":
        raise ValueError("/proc/stat: no cpu line first")
    ticks = [int(fields[1 + i]) for i in _BUSY]
    return sum(ticks) / 100.0  # USER_HZ is 100 on Linux


def serving_cpu_s(busy_s: float, before: str, after: str) -> float:
    """The host's busy seconds less what the engines spent in and between their steps."""
    totals = step_totals(after, before)
    engines = sum(w.get("busy_s", 0.0) + w.get("between_s", 0.0) for w in totals.values())
    return busy_s - engines


def solve(phases: dict[str, dict[str, float]]) -> dict[str, float]:
    """BASE, REQUEST_MS and TOKEN_MS from the three phases' serving seconds, wall seconds,
    requests and output tokens."""
    idles = [v for k, v in phases.items() if k.startswith("idle")]
    req, tok = phases["requests"], phases["tokens"]
    base = max(0.0, sum(v["serving_s"] for v in idles) / sum(v["wall_s"] for v in idles))
    request_ms = max(0.0, (req["serving_s"] - base * req["wall_s"]) / req["requests"]) * 1000
    rest = tok["serving_s"] - base * tok["wall_s"] - tok["requests"] * request_ms / 1000
    token_ms = max(0.0, rest / tok["tokens"]) * 1000
    return {"base_cores": base, "request_ms": request_ms, "token_ms": token_ms}


def engine_share(
    phase: dict[str, Any], decode: DecodeProfile, prefill: WorkerProfile,
    prompt_tokens: int, tokens: int,
) -> float:  # fmt: skip
    """SHARE from a phase in which one engine stepped with a core free: how much longer its
    steps took than `decode` and `prefill` price them, for the serving work beside them."""
    busy = sum(w.get("busy_s", 0.0) for w in phase["workers"].values())
    steps = sum(w.get("steps", 0.0) for w in phase["workers"].values())
    rows = sum(w.get("decode_rows", 0.0) for w in phase["workers"].values())
    computed = sum(w.get("prefill_tokens", 0.0) for w in phase["workers"].values())
    if not busy or not steps or not phase["wall_s"]:
        return 0.0
    context = prompt_tokens + tokens / 2  # a row's mean over its output
    priced_ms = (
        steps * decode.step_ms + rows * decode.row_ms + decode.ctx_ms * rows * context / 1000
        + prefill.token_ms * computed + prefill.attn_ms * computed * prompt_tokens / 2 / 1000
    )  # fmt: skip
    stretch = busy * 1000 / priced_ms
    demand = phase["serving_s"] / phase["wall_s"]
    if demand <= 0:
        return 0.0
    return min(1.0, max(0.0, (1 - 1 / stretch) / demand))  # stretch = 1 / (1 - SHARE * B)


async def _phase(
    url: str, model: str, prompts: list[list[int]], max_tokens: int, concurrency: int,
    idle_s: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    """One phase's host and engine readings; one at a time (`concurrency` 1), also each
    request's prefill-pool seconds (`prefill_ms`)."""
    before, busy0, t0 = await scrape_metrics(url), host_busy_s(), time.perf_counter()
    tokens, prefill_ms = 0, []
    if idle_s:
        await asyncio.sleep(idle_s)
    else:
        queue = list(prompts)

        async def one_stream(client: httpx.AsyncClient) -> None:
            nonlocal tokens
            while queue:
                prompt = queue.pop()
                result = RequestResult(0.0, len(prompt))
                request = TraceRequest.of_prompt(0.0, prompt, max_tokens)
                first = await scrape_metrics(url) if concurrency == 1 else None
                await stream_completion(client, model, request, result)
                if not result.ok:
                    raise RuntimeError(f"host_cpu probe failed: {result.error}")
                tokens += result.num_output_tokens
                last = await scrape_metrics(url) if first is not None else None
                if first is not None and last is not None:
                    steps = step_totals(last, first)
                    ms = sum(w["busy_s"] for k, w in steps.items() if k.startswith("prefill"))
                    if ms:
                        prefill_ms.append(ms * 1000)

        async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
            await asyncio.gather(*(one_stream(client) for _ in range(concurrency)))
    busy, wall, after = host_busy_s() - busy0, time.perf_counter() - t0, await scrape_metrics(url)
    if before is None or after is None:
        raise RuntimeError(f"{url}/metrics: no step totals to subtract")
    return {"wall_s": wall, "busy_s": busy, "serving_s": serving_cpu_s(busy, before, after),
            "requests": len(prompts) if not idle_s else 0, "tokens": tokens,
            "workers": step_totals(after, before), "prefill_ms": prefill_ms}  # fmt: skip


def co_run(
    alone: list[dict[str, Any]], beside: list[dict[str, Any]], costs: dict[str, float],
    cores: int, share: float,
) -> float:  # fmt: skip
    """CO_RUN from the same prefills run alone and beside a decoding engine, in alternating
    rounds (the host's speed drifts by the minute): how much slower the median prefill
    stepped beside it, less what the serving work's share of the core explains (bench/
    plan_host.py's slicing, at the demand the measured `costs` give each side's work)."""
    a = [ms for phase in alone for ms in phase.get("prefill_ms", [])]
    b = [ms for phase in beside for ms in phase.get("prefill_ms", [])]
    if not a or not b or not statistics.median(a):
        return 0.0  # no prefill pool: nothing stepped beside anything

    def sliced(phases: list[dict[str, Any]], engines: int) -> float:
        wall = sum(ph["wall_s"] for ph in phases)
        requests = sum(ph["requests"] for ph in phases)
        tokens = sum(w.get("decode_rows", 0.0) for ph in phases for w in ph["workers"].values())
        demand = costs["base_cores"] + (
            requests * costs["request_ms"] + tokens * costs["token_ms"]
        ) / (1000 * wall)
        return HostCPU(cores, demand, engine_share=share).stretch(0.0, engines)

    ratio = statistics.median(b) / statistics.median(a)
    return max(0.0, ratio * sliced(alone, 1) / sliced(beside, 2) - 1)


async def _beside(
    url: str, model: str, prompts: list[list[int]], streams: list[list[int]], tokens: int,
    concurrency: int,
) -> dict[str, float]:  # fmt: skip
    """`prompts` one at a time (two output tokens: the prefill pool computes them) while
    `concurrency` streams of `tokens` keep the decode worker stepping."""
    stop, pool = asyncio.Event(), itertools.cycle(streams)

    async def keep_decoding() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:

            async def one() -> None:
                while not stop.is_set():
                    prompt = next(pool)
                    await stream_completion(
                        client, model, TraceRequest.of_prompt(0.0, prompt, tokens),
                        RequestResult(0.0, len(prompt)),
                    )  # fmt: skip

            await asyncio.gather(*(one() for _ in range(concurrency)))

    task = asyncio.create_task(keep_decoding())
    try:
        await asyncio.sleep(1.0)  # the batch fills
        return await _phase(url, model, prompts, 2, 1)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=120.0)


async def measure(
    url: str, requests: int = 96, tokens: int = 64, prompt_tokens: int = 32,
    concurrency: int = 8, idle_s: float = 10.0, seed: int = 0, profile: str | Path | None = None,
    prefill_tokens: int = 512, prefills: int = 4, rounds: int = 3, context_tokens: int = 1024,
) -> dict[str, Any]:  # fmt: skip
    """The serving costs (`solve`), SHARE when the workers' `profile` is given, CO_RUN where
    the cluster has a prefill pool (`rounds` of `prefills` prompts of `prefill_tokens`, long
    enough to go there, alone then beside a decoding engine), and each phase's readings."""
    rng = random.Random(seed)
    model = await served_model(url)

    def prompts(n: int, length: int = prompt_tokens) -> list[list[int]]:
        return [[rng.randrange(10, 1000) for _ in range(length)] for _ in range(n)]

    await _phase(url, model, prompts(4), 4, 2)  # warm the path up
    # idle on both sides of the load: a fresh server's own loops settle over its first
    # minute (Ray's agents start, caches fill), so one idle look would date the base
    phases = {"idle": await _phase(url, model, [], 0, 0, idle_s=idle_s / 2)}
    phases["requests"] = await _phase(url, model, prompts(requests), 1, concurrency)
    phases["tokens"] = await _phase(url, model, prompts(requests // 2), tokens, concurrency)
    phases["idle_after"] = await _phase(url, model, [], 0, 0, idle_s=idle_s / 2)
    # the decoding engine beside the prefills reads contexts as long as a loaded one's:
    # prompts its cache holds (sent once first, through the prefill pool), so each stream
    # prefills one block and decodes on `context_tokens`
    contexts = prompts(concurrency // 2 or 1, context_tokens)
    await _phase(url, model, contexts, 2, 1)
    alone, beside = [], []
    for _ in range(rounds):
        alone.append(await _phase(url, model, prompts(prefills, prefill_tokens), 2, 1))
        beside.append(await _beside(
            url, model, prompts(prefills, prefill_tokens), contexts, tokens, concurrency
        ))  # fmt: skip
    phases["prefill_alone"], phases["prefill_beside"] = alone, beside
    out: dict[str, Any] = {**solve(phases), "engine_share": 0.0, "phases": phases}
    if profile is not None:
        out["engine_share"] = engine_share(
            phases["tokens"], DecodeProfile.load(profile), WorkerProfile.load(profile),
            prompt_tokens, tokens,
        )  # fmt: skip
    out["co_run"] = co_run(alone, beside, out, os.cpu_count() or 1, out["engine_share"])
    return out


def plan_flags(measured: dict[str, Any], cores: int | None = None) -> list[str]:
    """`baton plan --host-cpu ...` for what `measure` returned."""
    return ["--host-cpu", str(cores or os.cpu_count()), f"{measured['base_cores']:.3f}",
            f"{measured['request_ms']:.2f}", f"{measured['token_ms']:.3f}",
            f"{measured['engine_share']:.3f}", f"{measured['co_run']:.3f}"]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--requests", type=int, default=96,
                   help="in the requests phase (half as many in the tokens phase)")  # fmt: skip
    p.add_argument("--tokens", type=int, default=64, help="output tokens a request, last phase")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--profile", default=None,
                   help="the workers' `baton profile` JSON: also measure SHARE")  # fmt: skip
    args = p.parse_args(argv)
    r = asyncio.run(measure(args.url, args.requests, args.tokens, concurrency=args.concurrency,
                            idle_s=args.idle_s, profile=args.profile))  # fmt: skip
    print(f"serving CPU: {r['base_cores']:.3f} cores at idle, {r['request_ms']:.2f} ms a request,"
          f" {r['token_ms']:.3f} ms an output token, {r['engine_share']:.2f} of it on the "
          f"engine's core; an engine beside another {1 + r['co_run']:.2f}x slower "
          f"(baton plan {' '.join(plan_flags(r))})")  # fmt: skip


if __name__ == "__main__":
    main()
