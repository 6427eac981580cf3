"""What the served path's two Ray hops cost on this host: an actor call's round trip (the
front door's call that starts a request) and one streamed item's latency (a worker's step
of outputs reaching the door), with the cores idle and beside a CPU-bound load on every core
(what a CPU engine's compute threads are while a prompt computes; on a GPU host the engine's
work is the device's and the cores stay free).

    python -m bench.serving.ray_hops --out bench/results/serving/ray_hops_<cpu>.json

A one-node Ray of its own (its processes ended with it); the load is one process of
`torch.mm` on as many threads as the host has cores, started and ended by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

from bench.observability.slow_requests_overhead import cpu_model
from bench.paths import results_file


def _burn(stop_at: float, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(512, 512)
    while time.monotonic() < stop_at:
        a = torch.mm(a, a).clamp_(-1, 1)


def _ms(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"p50": 1e3 * statistics.median(values), "p90": 1e3 * values[int(0.9 * len(values))]}


async def _measure(actor, count: int) -> dict[str, dict[str, float]]:
    calls = []
    for i in range(count):
        start = time.perf_counter()
        await actor.ping.remote(i)
        calls.append(time.perf_counter() - start)
    items = []
    stream = actor.stream.options(num_returns="streaming").remote(count)
    async for ref in stream:
        sent = await ref
        items.append(time.perf_counter() - sent)
    return {"call_round_trip_ms": _ms(calls), "streamed_item_ms": _ms(items)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(results_file("serving", "ray_hops.json")))
    ap.add_argument("--cpu", default=cpu_model(), help="the CPU, as the JSON names it")
    ap.add_argument("--calls", type=int, default=300, help="calls and streamed items, each")
    args = ap.parse_args(argv)
    import ray

    @ray.remote
    class Echo:
        async def ping(self, x: int) -> int:
            return x

        async def stream(self, n: int):
            for _ in range(n):
                await asyncio.sleep(0.002)  # a step's outputs, every 2 ms
                yield time.perf_counter()

    cores = os.cpu_count() or 1
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    try:
        actor = Echo.remote()
        ray.get(actor.ping.remote(0), timeout=60)
        report: dict = {"command": "python -m bench.serving.ray_hops", "cpu": args.cpu,
                        "cores": cores, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
        report["idle"] = asyncio.run(_measure(actor, args.calls))
        burner = mp.get_context("spawn").Process(target=_burn, args=(time.monotonic() + 120, cores))
        burner.start()
        try:
            time.sleep(2)  # the load's threads running
            report["beside_a_load_on_every_core"] = asyncio.run(_measure(actor, args.calls))
        finally:
            burner.terminate()
            burner.join(10)
    finally:
        ray.shutdown()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("| the cores | call round trip p50 / p90 ms | streamed item p50 / p90 ms |")
    print("| --- | ---: | ---: |")
    for name in ("idle", "beside_a_load_on_every_core"):
        r = report[name]
        call, item = r["call_round_trip_ms"], r["streamed_item_ms"]
        print(f"| {name} | {call['p50']:.2f} / {call['p90']:.2f} "
              f"| {item['p50']:.2f} / {item['p90']:.2f} |")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
