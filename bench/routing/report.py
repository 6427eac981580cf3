"""The router simulator's tables (bench.routing.router_sim): one row per (workload, policy).

Reuse is cache hits plus tokens copied from a peer prefill worker (prefix migration); the
oracle's reuse is its hits. `reuse / oracle` is the routing target (computed prefill tokens
against the oracle's); `hit / oracle` (the JSON) counts the workers' own caches only.
"""

from __future__ import annotations

MISS_KEYS = (
    "hit",
    "transferred",
    "routed_away_holder_busier",
    "routed_away_other",
    "evicted_everywhere",
    "cold",
    "pooled_kept_no_worker_did",
    "duplicate_share",
)


def add_ratios(result: dict, oracle: dict) -> None:
    result["hit_over_oracle"] = result["hit_rate"] / oracle["hit_rate"]
    result["reuse_over_oracle"] = result["reuse_rate"] / oracle["hit_rate"]


def table(runs: dict) -> str:
    """One markdown table: a row per (workload, policy), the oracle first."""
    lines = [
        "| workload | blocks/worker | policy | computed tokens | hit rate | by transfer "
        "| reuse / oracle | load max/mean | TTFT p50 s | TTFT p99 s |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, res in runs.items():
        cap = res["capacity_blocks"]
        o = res["oracle_pooled_lru"]
        lines.append(
            f"| {name} | {cap} | oracle (pooled LRU) | {o['computed_tokens']:,} "
            f"| {o['hit_rate']:.3f} | - | 1.00 | - | - | - |"
        )
        for policy, r in res.items():
            if not isinstance(r, dict) or "ttft_p50_ms" not in r:
                continue
            lines.append(
                f"| {name} | {cap} | {policy} | {r['computed_tokens']:,} | {r['hit_rate']:.3f} "
                f"| {r['transfer_rate']:.3f} | {r['reuse_over_oracle']:.2f} "
                f"| {r['load_max_over_mean']:.2f} "
                f"| {r['ttft_p50_ms'] / 1000:.2f} | {r['ttft_p99_ms'] / 1000:.2f} |"
            )
    return "\n".join(lines)


def misses_table(runs: dict) -> str:
    """Where each policy's prompt blocks went (planner.sim.misses), shares of all blocks."""
    keys = MISS_KEYS
    lines = [
        "| workload | policy | " + " | ".join(k.replace("_", " ") for k in keys) + " |",
        "| --- | --- |" + " ---: |" * len(keys),
    ]
    for name, res in runs.items():
        for policy, r in res.items():
            if isinstance(r, dict) and "misses" in r:
                m = r["misses"]
                lines.append(
                    f"| {name} | {policy} | " + " | ".join(f"{m[k]:.3f}" for k in keys) + " |"
                )
    return "\n".join(lines)
