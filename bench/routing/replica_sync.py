"""How long one router replica's decision takes to reach another through Redis: what
bench.routing.router_sim's `--replica-sync-ms` stands for.

    python -m bench.routing.replica_sync [--samples 400]

Two RedisStores on one namespace of a fresh `redis-server`: replica A promises a block to a
worker (what a routing decision publishes) and the time until replica B's local index counts
it is taken, `--samples` times, 10 ms apart. It prints p50 / p90 / p99 / max in ms. The path
is the production one (A's publisher thread, a Lua call, B's consumer thread XREADing the
stream); Redis is local, so a cross-host deployment adds its network round trips.
"""

from __future__ import annotations

import argparse
import time

from bench.routing.router_sim import redis_server
from planner.sim.prefill_pool import percentile
from router.routing.index.redis_store import RedisStore


def measure(url: str, samples: int, timeout_s: float = 2.0) -> list[float]:
    """Milliseconds from A's promise to B seeing it, one per sample."""
    ns = f"replica-sync:{time.monotonic_ns()}"
    a, b = RedisStore(url, ns), RedisStore(url, ns)
    try:
        for store in (a, b):
            store.add_worker("m", "p0")
            store.sync(5.0)
        out = []
        for i in range(samples):
            block = 1 + i
            start = time.perf_counter()
            a.promise("m", "p0", [block], 60.0)
            while True:
                seen = b.longest_prefixes("m", [block])
                if seen is not None and seen.cached.get("p0", 0) >= 1:
                    break
                if time.perf_counter() - start > timeout_s:
                    raise TimeoutError(f"replica B never saw promise {i} within {timeout_s} s")
            out.append((time.perf_counter() - start) * 1000)
            time.sleep(0.01)
        return out
    finally:
        a.close()
        b.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=400)
    args = p.parse_args(argv)
    with redis_server() as url:
        ms = measure(url, args.samples)

    p50, p90, p99 = (percentile(ms, q) for q in (0.5, 0.9, 0.99))
    print(f"promise from replica A seen by replica B, {len(ms)} samples: p50 {p50:.2f} ms, "
          f"p90 {p90:.2f}, p99 {p99:.2f}, max {max(ms):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
