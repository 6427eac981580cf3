"""What the door's slow-request keeper costs a request, with no collector configured
(router/frontdoor/slow_requests.py: `--slow-requests 20`, the default, against 0).

Two measures:

1. requests through an in-process HTTP door (the FastAPI app over ASGI, no sockets) serving a
   real tiny engine (`LocalBackend`, CPU): the median request time with the keeper off (the
   API's no-op tracer) and on, in alternating rounds so drift falls on both arms alike;
2. the span work the cluster's request path adds on top of the door's own spans: the spans of
   one disaggregated request of `--tokens` output tokens (attempt, route, gate, reserve,
   prefill, admit, first token, a decode span per 16 tokens, finish, with their
   attributes), made on the keeper's provider, in microseconds per request, against the
   no-op tracer.

    python -m bench.observability.slow_requests_overhead [--rounds 10 --per-round 20]

Prints a table; writes bench/results/observability/slow_requests_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from opentelemetry import trace

from bench.paths import results_file
from core.tracing import DECODE_SPAN_TOKENS, SpanName, Tracing, TracingConfig
from router.frontdoor.slow_requests import SlowRequests


async def door_rounds(rounds: int, per_round: int, max_tokens: int) -> dict[str, list[float]]:
    """Seconds per request, per arm, over `rounds` alternating rounds."""
    import torch

    from core.config import EngineConfig
    from engine.tiny_model import make_tiny_model
    from router.frontdoor.http.app import create_app
    from tests.support.local_backend import LocalBackend

    torch.set_num_threads(1)
    model_dir = make_tiny_model(Path(tempfile.mkdtemp()) / "tiny-llama", arch="llama")
    config = EngineConfig(num_kv_blocks=64, max_model_len=256, max_num_seqs=4, num_threads=1)
    backend = LocalBackend(model_dir, config)
    keeper = SlowRequests()
    apps = {
        "off": create_app(backend, admin_token="t"),
        "on": create_app(
            backend,
            admin_token="t",
            tracing=Tracing(TracingConfig(), "baton-router", keeper),
            slow_requests=keeper,
        ),
    }
    body = {"model": backend.model_name, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "How long is a relay race?"}]}  # fmt: skip
    times: dict[str, list[float]] = {arm: [] for arm in apps}
    try:
        for i in range(rounds + 1):  # round 0 warms both arms up and is not counted
            for arm in ("off", "on") if i % 2 else ("on", "off"):
                transport = httpx.ASGITransport(app=apps[arm])
                async with httpx.AsyncClient(transport=transport, base_url="http://door") as c:
                    for _ in range(per_round):
                        started = time.perf_counter()
                        r = await c.post("/v1/chat/completions", json=body)
                        r.raise_for_status()
                        if i:
                            times[arm].append(time.perf_counter() - started)
    finally:
        backend.close()
    assert keeper.num_held() > 0
    return times


def request_path_spans(tracer: trace.Tracer, num_tokens: int) -> None:
    """The spans one disaggregated request's path records (router/cluster/attempt.py), under
    a root as the door opens it."""
    root = tracer.start_span(SpanName.REQUEST, attributes={"baton.door.route": "/v1/chat"})
    under_root = trace.set_span_in_context(root)
    attempt = tracer.start_span(SpanName.ATTEMPT, context=under_root)
    attempt.set_attributes({"baton.request_id": "r", "baton.attempt": 1, "baton.prompt_tokens": 64})
    under = trace.set_span_in_context(attempt)
    route = tracer.start_span(SpanName.ROUTE, context=under)
    route.set_attributes({"baton.route.candidates": ["prefill-0", "decode-0"],
                          "baton.route.cached_blocks": ["prefill-0=3"],
                          "baton.route.prefill_worker": "prefill-0"})  # fmt: skip
    route.end()
    worker = {"baton.worker": "decode-0"}
    for name in (SpanName.GATE_WAIT, SpanName.RESERVE, SpanName.PREFILL, SpanName.ADMIT):
        span = tracer.start_span(name, context=under, kind=trace.SpanKind.CLIENT, attributes=worker)
        span.set_attributes({"baton.cached_tokens": 0, "baton.blocks_sent": 4})
        span.end()
    tracer.start_span(SpanName.FIRST_TOKEN, context=under, attributes=worker).end()
    for start in range(0, num_tokens, DECODE_SPAN_TOKENS):
        span = tracer.start_span(SpanName.DECODE, context=under, attributes=worker)
        span.set_attributes({"baton.tokens.from": start, "baton.tokens.to": start + 16})
        span.end()
    attempt.end()
    tracer.start_span(SpanName.FINISH, context=under_root).end()
    root.set_attributes({"baton.e2e_s": 0.5, "baton.ttft_s": 0.1})
    root.end()


def span_cost_us(num_tokens: int, repeat: int) -> dict[str, float]:
    """Microseconds per request of `request_path_spans`: median of 5 runs of `repeat`."""
    tracers = {
        "off": Tracing().tracer,
        "on": Tracing(TracingConfig(), "baton-router", SlowRequests()).tracer,
    }
    out: dict[str, float] = {}
    for arm, tracer in tracers.items():
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(repeat):
                request_path_spans(tracer, num_tokens)
            runs.append((time.perf_counter() - started) / repeat * 1e6)
        out[arm] = statistics.median(runs)
    return out


def cpu_model() -> str:
    """The CPU as lscpu names it (timings are only compared on the same one)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256, help="output tokens (span cost)")
    parser.add_argument("--out", default="slow_requests_overhead.json")
    args = parser.parse_args()
    times = asyncio.run(door_rounds(args.rounds, args.per_round, args.max_tokens))
    door = {arm: 1000 * statistics.median(t) for arm, t in times.items()}
    spans = span_cost_us(args.tokens, 2000)
    result: dict[str, Any] = {
        "machine": cpu_model(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "python -m bench.observability.slow_requests_overhead",
        "door_request_ms_median": door,
        "door_overhead_pct": 100 * (door["on"] / door["off"] - 1),
        "num_requests_per_arm": len(times["on"]),
        "max_tokens": args.max_tokens,
        "request_path_spans_us": spans,
        "request_path_tokens": args.tokens,
    }
    print(f"door, {args.max_tokens} tokens, median ms/request: off {door['off']:.2f}  "
          f"on {door['on']:.2f}  ({result['door_overhead_pct']:+.1f}%)")  # fmt: skip
    print(f"request-path spans of a {args.tokens}-token request, us: off {spans['off']:.1f}  "
          f"on {spans['on']:.1f}")  # fmt: skip
    path = results_file("observability", args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
