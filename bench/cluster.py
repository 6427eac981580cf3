"""Cluster benchmark (issue 5): end-to-end TTFT, TPOT and throughput of 1 prefill + 1 decode
worker against 2 unified workers on the same cores, on a mixed workload (short chats plus
long prompts arriving at a fixed rate), through the cluster's request path (no HTTP).

    python -m bench.cluster                  # ~3 minutes on 2 cores
    python -m bench.cluster --rate 2 --requests 60

Prints the table and the share of TTFT spent waiting for KV transfer; writes
bench/results/cluster.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path

from core.config import EngineConfig
from core.sampling import SamplingParams
from router.frontdoor.backend import GenerateRequest

RESULTS = Path(__file__).parent / "results"
MODEL_SHAPE = {  # ~20M parameters: a 1k-token prefill takes ~1 s on one CPU thread
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 1536,
    "vocab_size": 4096,
}


def workload(
    n: int, rate: float, long_share: float, seed: int
) -> list[tuple[float, list[int], int]]:
    """(arrival s, prompt, max tokens): short chats (64-192 tokens) and long prompts (1-2k)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        long = rng.random() < long_share
        length = rng.randint(1024, 2048) if long else rng.randint(64, 192)
        prompt = [rng.randrange(10, 4000) for _ in range(length)]
        out.append((i / rate, prompt, 32))
    return out


async def run_config(model_dir: str, mode: str, requests: list, threads: int) -> dict:
    from router.cluster.bringup import start_cluster
    from router.cluster.spec import ClusterSpec
    from router.routing.route import RouterConfig

    spec = ClusterSpec(
        model_dir=model_dir,
        mode=mode,
        num_prefill=1 if mode == "disaggregated" else 0,
        num_decode=1 if mode == "disaggregated" else 2,
        engine=EngineConfig(num_kv_blocks=2048, max_num_batched_tokens=2048),
        num_threads=threads,
    )
    cluster = await start_cluster(
        spec, RouterConfig(disagg_min_uncached_tokens=256), controller_name=f"bench-{mode}"
    )
    backend = cluster.backend
    try:
        # warm-up
        async for _ in backend.generate(
            GenerateRequest("warm", [5] * 300, SamplingParams(max_tokens=2))
        ):
            pass
        backend.transfers.wait_s = 0.0
        t0 = time.monotonic()

        async def one(i: int, at: float, prompt: list[int], max_tokens: int) -> dict:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            start = time.monotonic()
            stamps: list[float] = []
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            async for out in backend.generate(GenerateRequest(f"{mode}-{i}", prompt, params)):
                stamps.extend([time.monotonic()] * len(out.new_token_ids))
            gaps = [b - a for a, b in itertools.pairwise(stamps)]
            return {
                "long": len(prompt) > 1000,
                "ttft": stamps[0] - start,
                "tpot": (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1),
                "max_gap": max(gaps, default=0.0),
                "e2e": stamps[-1] - start,
                "tokens": len(stamps),
            }

        results = await asyncio.gather(*(one(i, *r) for i, r in enumerate(requests)))
        wall = time.monotonic() - t0
        ttft_sum = sum(r["ttft"] for r in results)
        return {
            "mode": mode,
            "wall_s": wall,
            "results": results,
            "kv_wait_s": backend.transfers.wait_s,
            "kv_share_of_ttft": backend.transfers.wait_s / ttft_sum if ttft_sum else 0.0,
            "transfers": backend.transfers.num_transfers,
        }
    finally:
        await cluster.close()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def summarize(run: dict) -> dict:
    res = run["results"]
    short = [r for r in res if not r["long"]]
    return {
        "mode": run["mode"],
        "throughput_tok_s": sum(r["tokens"] for r in res) / run["wall_s"],
        "ttft_mean_s": statistics.mean(r["ttft"] for r in res),
        "ttft_p99_s": pct([r["ttft"] for r in res], 0.99),
        "short_ttft_mean_s": statistics.mean(r["ttft"] for r in short) if short else None,
        "tpot_mean_ms": 1e3 * statistics.mean(r["tpot"] for r in res),
        "tpot_p99_ms": 1e3 * pct([r["tpot"] for r in res], 0.99),
        "max_token_gap_p99_ms": 1e3 * pct([r["max_gap"] for r in res], 0.99),
        "kv_share_of_ttft": run["kv_share_of_ttft"],
        "transfers": run["transfers"],
    }


async def main_async(args: argparse.Namespace) -> None:
    from engine.tiny_model import make_tiny_model
    from router.cluster.bringup import init_ray

    model_dir = Path(args.model)
    if not (model_dir / "config.json").exists():
        make_tiny_model(model_dir, arch="llama", preset="tiny", seed=0, **MODEL_SHAPE)
    init_ray()
    reqs = workload(args.requests, args.rate, args.long_share, args.seed)
    runs = []
    for mode in ("disaggregated", "unified"):
        print(f"running {mode} ...", flush=True)
        runs.append(await run_config(str(model_dir.resolve()), mode, reqs, args.threads))
    rows = [summarize(r) for r in runs]
    print(
        f"\n{'mode':14} {'tok/s':>7} {'TTFT':>7} {'TTFT p99':>9} {'short TTFT':>10} "
        f"{'TPOT':>8} {'TPOT p99':>9} {'gap p99':>8} {'KV share':>8}"
    )
    for r in rows:
        print(
            f"{r['mode']:14} {r['throughput_tok_s']:7.1f} {r['ttft_mean_s']:6.2f}s "
            f"{r['ttft_p99_s']:8.2f}s {r['short_ttft_mean_s'] or 0:9.2f}s "
            f"{r['tpot_mean_ms']:6.1f}ms {r['tpot_p99_ms']:7.1f}ms "
            f"{r['max_token_gap_p99_ms']:6.0f}ms {r['kv_share_of_ttft']:7.1%}"
        )
    out = {
        "args": vars(args),
        "summary": rows,
        "runs": runs,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    RESULTS.mkdir(exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/bench-20m")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second")
    ap.add_argument("--long-share", type=float, default=0.2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "cluster.json"))
    asyncio.run(main_async(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
