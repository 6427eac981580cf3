"""What a decode worker laid out otherwise than its prefill worker pays for the KV handoff:
the landing area and the rewrite (worker/landing.py) against the straight copy of alike
pools, same process, same run.

    python -m bench.transfer.unlike_pools [--tokens 2048] [--repeat 5]

A prefill and a decode worker (the `small` preset model, tp=1, shm transport) in this process.
Per decode layout, each round times one prompt's handoff: from the decode worker's
reservation to every layer of its KV being in the decode worker's own blocks (the prefill
included, which is the same for every layout), and the prefill worker's reply alone; the
layouts alternate within each round, the prompt differs per round (no prefix hits). The
decode layouts: alike (block 16, float32: the baseline), block 32, an int8 cache, both.

Writes bench/results/transfer/unlike_pools_<host>.json and prints a table (medians, ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.paths import results_file
from core.config import EngineConfig
from core.request import EngineRequest
from core.roles import WorkerRole
from core.sampling import SamplingParams
from decode_worker.worker import DecodeWorker
from prefill_worker.worker import PrefillWorker
from worker.records import WorkerSpec

LAYOUTS = {
    "alike (block 16, float32)": {},
    "block 32": {"block_size": 32},
    "int8 cache": {"kv_cache_dtype": "int8"},
    "block 32, int8 cache": {"block_size": 32, "kv_cache_dtype": "int8"},
}
TIMEOUT_S = 120.0


async def handoff(prefill: PrefillWorker, decode: DecodeWorker, req: EngineRequest) -> tuple:
    """(ms to the KV in the decode worker's blocks, ms of the prefill's reply)."""
    start = time.perf_counter()
    res = await decode.reserve(req, TIMEOUT_S, prefill.worker_id)
    reply = await prefill.prefill(
        req, decode.worker_id, res.dst_block_ids, res.skip_blocks, TIMEOUT_S
    )
    replied = time.perf_counter()
    # Admitted once every layer is in its blocks (the admission itself: microseconds).
    await decode.admit(req.request_id, reply.first_token, None, TIMEOUT_S, f"ch-{req.request_id}")
    arrived = time.perf_counter()
    await decode.abort(req.request_id)
    return (arrived - start) * 1e3, (replied - start) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--host", default="host", help="names the result file (e.g. xeon_amx)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    out = args.out or results_file("transfer", f"unlike_pools_{args.host}.json")

    from engine.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as scratch:
        model = str(make_tiny_model(Path(scratch) / "small", preset="small"))
        base = EngineConfig(num_kv_blocks=1024, max_num_batched_tokens=args.tokens)
        prefill = PrefillWorker(WorkerSpec("p0", WorkerRole.PREFILL, model, base, transport="shm"))
        decodes = {}
        for i, (name, changes) in enumerate(LAYOUTS.items()):
            spec = WorkerSpec(f"d{i}", WorkerRole.DECODE, model, replace(base, **changes),
                              transport="shm")  # fmt: skip
            decodes[name] = DecodeWorker(spec)

        async def connect_and_run() -> dict[str, list[tuple[float, float]]]:
            for decode in decodes.values():
                await prefill.route(await decode.accept(prefill.info().transport_metadata))
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in LAYOUTS}
            rng = random.Random(7)
            for round_ in range(args.repeat + 1):  # the first round warms up
                for name, decode in decodes.items():
                    prompt = [rng.randrange(3, 1000) for _ in range(args.tokens)]
                    req = EngineRequest(f"{round_}-{decode.worker_id}", prompt,
                                        SamplingParams(max_tokens=2, temperature=0))  # fmt: skip
                    timed = await handoff(prefill, decode, req)
                    if round_:
                        runs[name].append(timed)
            return runs

        try:
            runs = asyncio.run(connect_and_run())
        finally:
            for worker in (prefill, *decodes.values()):
                worker.shutdown()

    alike = statistics.median(t for t, _ in runs[next(iter(LAYOUTS))])
    result = {
        "machine": platform.processor() or platform.machine(),
        "model": "small preset (make_tiny_model)",
        "prompt_tokens": args.tokens,
        "rounds": args.repeat,
        "layouts": {
            name: {
                "handoff_ms_median": statistics.median(t for t, _ in timed),
                "prefill_reply_ms_median": statistics.median(r for _, r in timed),
                "after_reply_ms_median": statistics.median(t - r for t, r in timed),
                "vs_alike_ms": statistics.median(t for t, _ in timed) - alike,
                "runs_ms": timed,
            }
            for name, timed in runs.items()
        },
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"| decode layout ({args.tokens}-token prompt) | reservation to KV in its blocks "
          "| prefill's reply | after the reply | vs alike |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, row in result["layouts"].items():
        print(f"| {name} | {row['handoff_ms_median']:.1f} | {row['prefill_reply_ms_median']:.1f} "
              f"| {row['after_reply_ms_median']:.1f} | {row['vs_alike_ms']:+.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
