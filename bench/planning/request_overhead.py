"""A served request's overhead on its first token, beyond the engine steps that compute it:
`baton plan --request-overhead-ms LOCAL DISAGG`, measured on a running cluster at idle.

    python -m bench.planning.request_overhead --url http://127.0.0.1:8000 [--samples 8]

One request at a time (nothing else may run on the cluster): `--local-tokens` prompts,
shorter than the cluster's `--disagg-min-uncached-tokens`, so their decode worker prefills
them (one output token), then `--disagg-tokens` prompts, which go through the prefill pool
(two output tokens, so the decode worker admits them: reserve, prefill, admit, the output
stream). Every prompt is new (no prefix cached). A request's engine time is what the
workers' `baton:worker_step_seconds_total` counters gained while it ran (for the prefill
pool's, the prefill workers' only: the decode worker's step after the admission comes after
the first token). Overhead = client TTFT - engine time; the medians are printed.

Measured (2 cores, 20M bench model, 1 prefill + 1 decode worker): local 10-12 ms (the door
3-8, the generate call ~3, the output stream ~3, the stream to the client 1-2); through the
prefill pool 14-16 ms on a Xeon AMX (gate, reserve and prefill calls 7-9 before the prefill
starts; the first token rides on the prefill's reply), 29 when the first token waited for the
admission on the decode worker (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
from pathlib import Path
from typing import Any

import httpx

from loadgen.client import scrape_metrics, stream_completion
from loadgen.metrics import RequestResult
from loadgen.run import metrics_after_steps, served_model, step_totals
from loadgen.traces import TraceRequest


def overhead_ms(ttft_s: float, before: str, after: str, prefill_pool: bool) -> float:
    """One request's TTFT less the engine seconds it cost (its first token's share)."""
    busy = step_totals(after, before)
    engine_s = sum(
        w["busy_s"] for wid, w in busy.items() if not prefill_pool or wid.startswith("prefill")
    )
    return (ttft_s - engine_s) * 1000


async def measure(
    url: str, samples: int = 8, local_tokens: int = 64, disagg_tokens: int = 512, seed: int = 0
) -> dict[str, Any]:
    rng = random.Random(seed)
    model = await served_model(url)
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        for name, length, max_tokens in (
            ("local", local_tokens, 1),
            ("disagg", disagg_tokens, 2),
        ):
            values = []
            for i in range(2 + samples):  # the first two warm the path up
                prompt = [rng.randrange(10, 1000) for _ in range(length)]
                before = await scrape_metrics(url)
                result = RequestResult(0.0, length)
                await stream_completion(
                    client, model, TraceRequest.of_prompt(0.0, prompt, max_tokens), result
                )
                after = None
                if before is not None:  # the prefill pool's step is the one it counts
                    pool = "prefill" if name == "disagg" else ""
                    after = await metrics_after_steps(url, before, pool)
                if not result.ok or result.ttft_s is None or before is None or after is None:
                    raise RuntimeError(f"{name} probe {i} failed: {result.error or 'no /metrics'}")
                if i >= 2:
                    values.append(overhead_ms(result.ttft_s, before, after, name == "disagg"))
                await asyncio.sleep(0.1)
            out[f"{name}_ms"] = statistics.median(values)
            out[f"{name}_samples_ms"] = [round(v, 2) for v in values]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--local-tokens", type=int, default=64)
    p.add_argument("--disagg-tokens", type=int, default=512)
    p.add_argument("--out", default=None, help="also write the figures here (JSON)")
    args = p.parse_args(argv)
    r = asyncio.run(measure(args.url, args.samples, args.local_tokens, args.disagg_tokens))
    if args.out:
        doc = {"args": vars(args), **r, "load_avg_1m": os.getloadavg()[0]}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"request overhead: local {r['local_ms']:.1f} ms, through the prefill pool "
          f"{r['disagg_ms']:.1f} ms (medians of {args.samples}; baton plan "
          f"--request-overhead-ms {r['local_ms']:.1f} {r['disagg_ms']:.1f})")  # fmt: skip


if __name__ == "__main__":
    main()
