"""What the autoscaling benchmarks (bursty.py, two_phase.py) read of a server's pools: its
pool sizes sampled once a second, and the worker-seconds they add up to."""

from __future__ import annotations

import asyncio
import time

from loadgen.client import scrape_metrics
from loadgen.metrics import scrape_by_label

Samples = list[tuple[float, dict[str, int]]]
"""(seconds since sampling began, workers per pool)."""


async def sample_pools(url: str, samples: Samples) -> None:
    """Append (time, workers per pool) once a second until cancelled."""
    start = time.monotonic()
    while True:
        exposition = await scrape_metrics(url)
        if exposition is not None:
            sizes = scrape_by_label(exposition, "baton:pool_size", "pool")
            samples.append((time.monotonic() - start, {k: int(v) for k, v in sizes.items()}))
        await asyncio.sleep(1.0)


def worker_seconds(samples: Samples, end_s: float) -> dict[str, float]:
    """Each pool's workers integrated over time up to `end_s` (a sample holds until the next)."""
    total: dict[str, float] = {}
    for (t, sizes), (t_next, _) in zip(samples, [*samples[1:], (end_s, {})], strict=True):
        for pool, n in sizes.items():
            total[pool] = total.get(pool, 0.0) + n * max(0.0, min(t_next, end_s) - t)
    return total
