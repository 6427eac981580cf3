"""Front-door replicas keep the prefix hit rate: one replayed workload through 1, 2 and 4
front doors on different hosts, in one run.

    python -m bench.routing.replicas [--quick] [--out bench/results/routing/replicas.json]

Hosts are network namespaces (tests/multinode/bed.py; needs root). h1 is the Ray head and
the first front door (so the controller's host), h2 runs the workers (4 prefill, 1 decode),
h3..h5 the replicas (`baton serve --attach`). Every layout is a fresh cluster, so each
starts with cold caches and sees the same requests at the same times: a multi-tenant
shared-prefix workload (8 system prompts of 512 tokens, a unique 256-token user part, so no
prompt is short enough past a cached prefix to be prefilled on its decode worker and every
one goes through the prefill pool; Poisson arrivals at a rate the two shared cores serve
without queueing, so the figure measures routing rather than overload), sent round-robin
over the front doors from h1.

The figure is the prefill pool's prefix hit rate over the run: cached prompt tokens /
prompt tokens, the difference of the workers' life counters (admin state) before and after.
A front door that missed other front doors' KV events would send a tenant to a worker
without its prefix and recompute it. Also shown: the prompt tokens each prefill worker took
(load spread), TTFT, one front door run twice (the noise between two identical runs), and
the same run through one front door with round-robin routing (what no prefix view at all
looks like), so the gap the 2% target guards is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.paths import results_file
from loadgen.client import run_load
from loadgen.metrics import SLO, summarize
from loadgen.run import served_model
from loadgen.traces import TraceRequest
from loadgen.workloads import TokenSpace, shared_prefix, with_poisson_arrivals
from tests.multinode.bed import Bed, can_make_namespaces

ADMIN_TOKEN = "bench-replicas"
HTTP_PORT, GRPC_PORT = 8000, 50051
WORKERS_HOST, REPLICA_HOSTS = 2, (3, 4, 5)
NUM_PREFILL = 4


def workload(num_requests: int, rate: float, vocab: int) -> list[TraceRequest]:
    requests = shared_prefix(
        num_requests, TokenSpace(high=vocab), num_tenants=8, system_tokens=512,
        user_tokens=256, output_len=16, seed=1,
    )  # fmt: skip
    return with_poisson_arrivals(requests, rate, seed=2)


async def prefill_counters(url: str) -> dict[str, tuple[int, int]]:
    """Prefill worker -> (prompt tokens, cached prompt tokens) over its life."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(headers=headers, timeout=10.0) as client:
        resp = await client.get(f"{url}/admin/api/state")
        resp.raise_for_status()
    return {
        w["worker_id"]: (w["num_prompt_tokens"], w["num_cached_prompt_tokens"])
        for pool in resp.json()["pools"]
        for w in pool["workers"]
        if w["role"] == "prefill"
    }


async def client(urls: list[str], num_requests: int, rate: float, vocab: int) -> dict[str, Any]:
    """Runs on h1: the workload, request i through front door i mod N; the hit rates."""
    requests = workload(num_requests, rate, vocab)
    model = await served_model(urls[0])
    before = await prefill_counters(urls[0])
    shares = [requests[i :: len(urls)] for i in range(len(urls))]
    t0 = time.monotonic()
    runs = await asyncio.gather(
        *(run_load(url, model, share, max_duration_s=600.0, progress=False)
          for url, share in zip(urls, shares, strict=True))
    )  # fmt: skip
    duration = time.monotonic() - t0
    results = [r for run in runs for r in run.results]
    summary = summarize(results, duration, SLO(2.0, 0.2), None)
    # Worker reports reach the front door on its polling period: wait until every prompt
    # the run sent is counted (each is prefilled once; none is lost or retried here).
    sent = sum(len(r.prompt_token_ids) for r in requests)
    deadline = time.monotonic() + 30.0
    while True:
        after = await prefill_counters(urls[0])
        grown = {w: tuple(a - b for a, b in zip(after[w], before.get(w, (0, 0)), strict=True))
                 for w in after}  # fmt: skip
        prompt = sum(p for p, _ in grown.values())
        if prompt >= sent or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    cached = sum(c for _, c in grown.values())
    return {
        "num_front_doors": len(urls),
        "num_ok": summary["num_ok"],
        "num_requests": summary["num_requests"],
        "prompt_tokens_sent": sent,
        "prefill_prompt_tokens": prompt,
        "prefill_cached_tokens": cached,
        "prefill_hit_rate": cached / prompt if prompt else None,
        "decode_hit_rate": summary["prefix_hit_rate"],
        "prompt_tokens_per_prefill_worker": sorted(p for p, _ in grown.values()),
        "ttft_s": summary["ttft_s"],
        "tpot_s": summary["tpot_s"],
        "duration_s": duration,
    }


def run_layout(num_front_doors: int, policy: str, model_dir: Path, args: argparse.Namespace,
               subnet: int) -> dict[str, Any]:  # fmt: skip
    """A fresh cluster with `num_front_doors` front doors; the client's result."""
    replicas = REPLICA_HOSTS[: num_front_doors - 1]
    with Bed(num_hosts=2 + len(replicas), subnet=subnet) as bed:
        bed.start_ray(1, num_cpus=1, resources={})
        bed.start_ray(WORKERS_HOST, num_cpus=NUM_PREFILL + 1,
                      resources={"prefill": NUM_PREFILL, "decode": 1})  # fmt: skip
        for host in replicas:
            bed.start_ray(host, num_cpus=1, resources={})
        bed.wait_for_nodes(2 + len(replicas))

        def serve(host: int, *extra: str) -> None:
            bed.spawn(host, [
                sys.executable, "-m", "router.cli", "serve", "--address", bed.gcs,
                "--host", bed.address(host), "--port", str(HTTP_PORT),
                "--grpc-port", str(GRPC_PORT), "--admin-token", ADMIN_TOKEN, *extra,
            ], f"frontdoor-h{host}.log")  # fmt: skip
            bed.wait_http(host, HTTP_PORT)

        serve(1, "--model", str(model_dir), "--prefill", str(NUM_PREFILL), "--decode", "1",
              "--policy", policy, "--kv-cache-gb", "0.5", "--threads", "1",
              "--max-num-seqs", "32")  # fmt: skip
        for host in replicas:
            serve(host, "--attach")
        urls = [f"http://{bed.address(h)}:{HTTP_PORT}" for h in (1, *replicas)]
        out = bed.root / "replicas.json"
        done = bed.run(1, [
            sys.executable, "-m", "bench.routing.replicas", "--client", ",".join(urls),
            "--num-requests", str(args.num_requests), "--rate", str(args.rate),
            "--vocab", str(_vocab(model_dir)), "--out", str(out),
        ], timeout_s=900)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the client failed in the bed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
        result["policy"] = policy
        return result


def _vocab(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def report(rows: list[dict[str, Any]]) -> None:
    base = rows[0]["prefill_hit_rate"]
    print(f"\n{'front doors':>11} {'policy':12} {'ok':>7} {'prefill hit':>11} {'vs 1':>7}"
          f" {'decode hit':>10} {'TTFT mean':>10}  prompt tokens per prefill worker")  # fmt: skip
    for r in rows:
        rel = (r["prefill_hit_rate"] - base) / base if base else 0.0
        ok = f"{r['num_ok']}/{r['num_requests']}"
        spread = r["prompt_tokens_per_prefill_worker"]
        print(f"{r['num_front_doors']:11d} {r['policy']:12} {ok:>7} {r['prefill_hit_rate']:11.4f}"
              f" {100 * rel:+6.2f}% {r['decode_hit_rate'] or 0:10.4f}"
              f" {1000 * r['ttft_s']['mean']:8.0f}ms  {spread}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--rate", type=float, default=0.5, help="requests per second")
    parser.add_argument("--out", default=str(results_file("routing", "replicas.json")))
    parser.add_argument("--client", help=argparse.SUPPRESS)  # inside the bed: front door URLs
    parser.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        result = asyncio.run(client(args.client.split(","), args.num_requests, args.rate,
                                    args.vocab))  # fmt: skip
        Path(args.out).write_text(json.dumps(result, indent=2))
        return
    why = can_make_namespaces()
    if why is not None:
        raise SystemExit(f"bench.routing.replicas: {why}")
    from loadgen.compare import ensure_bench_model

    if args.quick:
        args.num_requests = 24
    model_dir = ensure_bench_model(None)
    layouts = [(1, "cache_aware"), (2, "cache_aware"), (4, "cache_aware"), (1, "cache_aware"),
               (1, "round_robin")]  # fmt: skip
    if args.quick:
        layouts = layouts[:2]
    rows = []
    for i, (n, policy) in enumerate(layouts):
        rows.append(run_layout(n, policy, model_dir, args, subnet=10 + i))
        report(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "runs": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
