"""Chaos soak: the chaos driver (bench/chaos/driver.py) for minutes on a local 2 prefill + 2
decode cluster of the tiny model, a prefill or decode worker killed every ~20 s and some
clients hanging up mid-stream; then the cluster must settle (KV free, pools at size).

    python -m bench.chaos.soak --minutes 10 --kill-every 20

Prints the counts (requests, kills, exact streams, clean errors, hung: must be 0) and writes
bench/results/chaos/soak.json. Exits 1 if any stream differed, hung or failed unclearly, or the
cluster did not settle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench.chaos.driver import ChaosPlan, ChaosRun, settle
from bench.chaos.workload import workload
from bench.paths import results_file
from core.config import EngineConfig


async def soak(args: argparse.Namespace, model_dir: Path) -> dict:
    from router.cluster.bringup import start_cluster
    from router.cluster.spec import ClusterSpec
    from router.routing.route import RouterConfig

    spec = ClusterSpec(
        model_dir=str(model_dir),
        num_prefill=args.prefill,
        num_decode=args.decode,
        engine=EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512),
        health_interval_s=0.5,
    )
    cluster = await start_cluster(
        spec, RouterConfig(disagg_min_uncached_tokens=0), controller_name="soak"
    )
    try:
        specs, references = workload(
            cluster.backend.tokenizer, model_dir, 24, args.max_tokens, args.seed
        )
        plan = ChaosPlan(
            seed=args.seed,
            num_requests=None,
            duration_s=60 * args.minutes,
            concurrency=args.concurrency,
            kill_every_tokens=None,
            kill_every_s=args.kill_every,
        )
        report = await ChaosRun(cluster, specs, references, plan).run()
        settled = ""
        try:
            await settle(cluster)
        except AssertionError as e:
            settled = str(e)
    finally:
        await cluster.close()
    return {"plan": asdict(plan), "report": report.to_json(), "summary": report.summary(),
            "ok": report.ok and not settled, "not_settled": settled}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--kill-every", type=float, default=20.0, help="seconds between kills")
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--prefill", type=int, default=2)
    ap.add_argument("--decode", type=int, default=2)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--out", default=str(results_file("chaos", "soak.json")))
    args = ap.parse_args(argv)

    from engine.tiny_model import make_tiny_model
    from router.cluster.bringup import init_ray

    init_ray()
    import ray

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = make_tiny_model(Path(tmp) / "tiny", arch="llama")
            result = asyncio.run(soak(args, model_dir))
    finally:
        ray.shutdown()
    report = result["report"]
    counts = report["counts"]
    print(result["summary"])
    print(
        f"requests {report['num_requests']}  kills {report['num_kills']}  "
        f"exact {counts['exact']}  hung up {counts['hung_up']}  "
        f"clean errors {counts['clean_error']}  differs {counts['differs']}  "
        f"bad errors {counts['bad_error']}  hung {counts['hung']}"
    )
    for line in report["problems"]:
        print("  problem:", line)
    if result["not_settled"]:
        print("  not settled:", result["not_settled"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    out = {"args": vars(args), "started": started, **result}
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
