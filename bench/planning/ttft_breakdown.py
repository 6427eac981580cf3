"""Where a first token's time goes on the served path: one request at a time through a
running server that exports its traces to `receiver`, each request's spans (door, router,
workers) placed on its timeline, and the engine's own step time (the workers' step-seconds
counters over the request) beside the client's TTFT.

    python -m bench.planning.ttft_breakdown --model DIR [--mode unified|1p1d] [--prompt 256]

Per span (service, name): the median offset of its start from the door's root span and its
median duration, over the requests; and the medians of the client's TTFT, the engine's
busy seconds while the request ran, and their difference (the served path's share); and the
two edges no span holds: the client's send to the door's root span, and the door's first
token to the client's. The device check (bench/device/served.py) runs it on the GPU beside
the rate sweep; here it starts its own server with the receiver in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from loadgen.client import scrape_metrics, stream_completion
from loadgen.metrics import RequestResult
from loadgen.run import metrics_after_steps, served_model, step_totals
from loadgen.traces import TraceRequest

SERVE_FLAGS = {
    "unified": ["--mode", "unified", "--prefill", "0", "--decode", "1"],
    "1p1d": ["--mode", "disaggregated", "--prefill", "1", "--decode", "1"],
}


async def sample(url: str, requests: int, prompt_len: int, seed: int = 0) -> list[dict[str, Any]]:
    """`requests` + 2 sequential single-token requests of `prompt_len` new tokens (the first
    two warm the path and are dropped): each one's client TTFT and engine busy seconds."""
    rng = random.Random(seed)
    model = await served_model(url)
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        for i in range(requests + 2):
            prompt = [rng.randrange(10, 1000) for _ in range(prompt_len)]
            before = await scrape_metrics(url)
            start_ns = time.time_ns()
            result = RequestResult(0.0, prompt_len)
            await stream_completion(client, model, TraceRequest.of_prompt(0.0, prompt, 1), result)
            after = await metrics_after_steps(url, before) if before else None
            if not result.ok or result.ttft_s is None or before is None or after is None:
                raise RuntimeError(f"request {i} failed: {result.error or 'no /metrics'}")
            busy = sum(w["busy_s"] for w in step_totals(after, before).values())
            if i >= 2:
                out.append({"sent_ns": start_ns, "ttft_s": result.ttft_s, "engine_s": busy})
            await asyncio.sleep(0.1)
    return out


def breakdown(samples: list[dict[str, Any]], spans: list[Any]) -> dict[str, Any]:
    """The medians, and each span's placement, from the receiver's spans of these requests
    (traces whose root began after the first request was sent)."""
    first = min(s["sent_ns"] for s in samples)
    traces: dict[str, list[Any]] = collections.defaultdict(list)
    for span in spans:
        traces[span.trace_id].append(span)
    placed: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    for trace_spans in traces.values():
        roots = [s for s in trace_spans if s.name == "baton.request" and s.start_ns >= first]
        if not roots:
            continue
        root = roots[0]
        for s in trace_spans:
            offset_ms, duration_ms = (
                (s.start_ns - root.start_ns) / 1e6,
                (s.end_ns - s.start_ns) / 1e6,
            )
            placed[(s.service, s.name)].append((offset_ms, duration_ms))
    rows = []
    for (service, name), v in placed.items():
        rows.append({"service": service, "span": name, "n": len(v),
                     "start_ms": statistics.median(x[0] for x in v),
                     "duration_ms": statistics.median(x[1] for x in v)})  # fmt: skip
    rows.sort(key=lambda r: r["start_ms"])
    ttft = statistics.median(s["ttft_s"] for s in samples) * 1e3
    edges = _edges(samples, traces)
    engine = statistics.median(s["engine_s"] for s in samples) * 1e3
    outside = statistics.median((s["ttft_s"] - s["engine_s"]) * 1e3 for s in samples)
    return {"requests": len(samples), "ttft_p50_ms": ttft, "engine_p50_ms": engine,
            "outside_engine_p50_ms": outside, **edges, "spans": rows}  # fmt: skip


def _edges(samples: list[dict[str, Any]], traces: dict[str, list[Any]]) -> dict[str, float]:
    """What the spans cannot show, from each sample's own trace (the first root after it was
    sent): the client's send to the door's root span (the client, the HTTP server and the
    middleware before the door's), and the end of the door's first-token span to the
    client's first token (the reply written out and read)."""
    roots = sorted(
        (s for spans in traces.values() for s in spans if s.name == "baton.request"),
        key=lambda s: s.start_ns,
    )
    to_door, to_client = [], []
    for sample in samples:
        root = next((r for r in roots if r.start_ns >= sample["sent_ns"]), None)
        if root is None:
            continue
        to_door.append((root.start_ns - sample["sent_ns"]) / 1e6)
        first = [s for s in traces[root.trace_id] if s.name == "first_token"]
        if first:
            got_ns = sample["sent_ns"] + sample["ttft_s"] * 1e9
            to_client.append((got_ns - first[0].end_ns) / 1e6)
    edges = {}
    if to_door:
        edges["client_to_door_p50_ms"] = statistics.median(to_door)
    if to_client:
        edges["first_token_to_client_p50_ms"] = statistics.median(to_client)
    return edges


def table(result: dict[str, Any]) -> str:
    lines = [
        f"TTFT p50 {result['ttft_p50_ms']:.2f} ms, engine {result['engine_p50_ms']:.2f} ms, "
        f"outside the engine {result['outside_engine_p50_ms']:.2f} ms "
        f"({result['requests']} requests)"
    ]
    if "client_to_door_p50_ms" in result:
        lines.append(f"  the client's send to the door's root span: "
                     f"{result['client_to_door_p50_ms']:.2f} ms")  # fmt: skip
    if "first_token_to_client_p50_ms" in result:
        lines.append(f"  the door's first token to the client's: "
                     f"{result['first_token_to_client_p50_ms']:.2f} ms")  # fmt: skip
    for r in result["spans"]:
        lines.append(f"  {r['service']:<14} {r['span']:<22} at {r['start_ms']:7.2f}  "
                     f"for {r['duration_ms']:7.2f} ms")  # fmt: skip
    return "\n".join(lines)


def serve_and_break_down(
    serve_args: list[str], log: Path, requests: int, prompt_len: int, start_timeout_s: float = 240
) -> dict[str, Any]:
    """`baton serve serve_args` exporting its traces to a receiver here, sampled and broken
    down (the server's log in `log`)."""
    from loadgen.server import ServerProcess
    from tests.support.otlp_receiver import OTLPReceiver

    receiver = OTLPReceiver().start()
    try:
        serve = [*serve_args, "--otlp-traces-endpoint", receiver.endpoint]
        with ServerProcess(serve, log, start_timeout_s=start_timeout_s) as server:
            samples = asyncio.run(sample(server.url, requests, prompt_len))
        time.sleep(6)  # the exporters' last batches (they flush every 5 s)
        return breakdown(samples, receiver.spans)
    finally:
        receiver.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a checkpoint folder")
    p.add_argument("--mode", choices=list(SERVE_FLAGS), default="unified")
    p.add_argument("--prompt", type=int, default=256, help="new prompt tokens a request")
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    serve = ["--model", args.model, "--device", args.device, *SERVE_FLAGS[args.mode]]
    log = Path("/tmp") / f"ttft_breakdown_{args.mode}.log"
    found = serve_and_break_down(serve, log, args.requests, args.prompt)
    result = {"mode": args.mode, "prompt": args.prompt, **found}
    print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
