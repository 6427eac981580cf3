"""KV offload benchmark: the Mooncake trace replayed on one engine whose prefix
cache holds a quarter of the trace's working set, with and without the host + disk tiers
(engine/kv_cache/offload.py), against a cache that holds all of it. Same process, same run.

    python -m bench.engine.offload                      # the whole trace (~4,000 requests)
    python -m bench.engine.offload --requests 800 --cache-share 0.25

The trace (shared/traces/mooncake) names each prompt's blocks by chained ids; every id
becomes one engine block of 16 tokens drawn from the id (equal ids, equal tokens), so the
trace's reuse is the engine's. Requests run one at a time with one output token: the time
of each is its TTFT with nothing queued before it (the cache alone moves it). The model is
the `trained` preset's shape with random weights (speed and reuse do not depend on them)
and room for the trace's longest prompt (264 blocks).

Configurations, each a fresh engine:
  cache-25%         device cache = share * working set (at least the longest prompt)
  cache-25%+tiers   the same, plus a host tier (`--host-share` of the working set) and a
                    disk tier (`--disk-share`) below it
  unbounded         a device cache holding the whole working set (the hit-rate ceiling)

Also measured: the cost of restoring a block from each tier against recomputing it (the
prefill seconds per computed token of the cache-25% run, times the block size).

Writes bench/results/engine/offload.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.paths import results_file
from core.sampling import SamplingParams
from engine.kv_cache.offload import KVOffload
from engine.llm import LLM
from loadgen.traces import DEFAULT_TRACE, read_jsonl

MODEL = Path(tempfile.gettempdir()) / "baton-bench-offload-model"
BLOCK = 16
ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def ensure_model() -> Path:
    if not (MODEL / "config.json").exists():
        from engine.tiny_model import make_tiny_model

        make_tiny_model(MODEL, arch="llama", preset="trained", max_position_embeddings=8192)
    return MODEL


def trace_prompts(n: int, vocab: int) -> tuple[list[list[int]], int]:
    """The first `n` trace requests as token ids (one 16-token block per hash id), and the
    working set: how many distinct blocks they name."""
    blocks: dict[int, list[int]] = {}

    def block(hash_id: int) -> list[int]:
        if hash_id not in blocks:
            rng = random.Random(hash_id)
            blocks[hash_id] = [rng.randrange(3, vocab) for _ in range(BLOCK)]
        return blocks[hash_id]

    prompts = [
        [t for h in r.hash_ids for t in block(h)] + [1]  # + 1: the last block can hit too
        for r in read_jsonl(DEFAULT_TRACE["mooncake"], limit=n)
    ]
    return prompts, len(blocks)


def replay(llm: LLM, prompts: list[list[int]]) -> dict:
    ttfts = []
    start = time.perf_counter()
    for p in prompts:
        t = time.perf_counter()
        llm.generate([p], ONE_TOKEN)
        ttfts.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    kv = llm.engine.kv
    result = {
        "prefix_hit_rate": kv.num_cached_prompt_tokens / kv.num_prompt_tokens,
        "computed_tokens": kv.num_prompt_tokens - kv.num_cached_prompt_tokens,
        "ttft_mean_ms": 1e3 * statistics.fmean(ttfts),
        "ttft_p50_ms": 1e3 * statistics.median(ttfts),
        "ttft_p90_ms": 1e3 * statistics.quantiles(ttfts, n=10)[-1],
        "wall_s": wall,
    }
    offload = kv.pool.offload
    if offload is not None:
        result["tiers"] = {t.name: {"slots": t.num_slots, **vars(t.stats)} for t in offload.tiers}
        result["restore_us_per_block"] = restore_cost(llm)
    return result


def restore_cost(llm: LLM, samples: int = 200) -> dict[str, float]:
    """Microseconds to copy one block back from each tier (into a free device block)."""
    pool = llm.engine.kv.pool
    offload = pool.offload
    assert offload is not None
    out = {}
    [target] = pool.allocate(1)
    for tier in offload.tiers:
        held = list(tier._lru.items())[-samples:]
        if not held:
            continue
        start = time.perf_counter()
        for h, (_, tokens) in held:
            offload.restore(h, tokens, target.block_id)
        out[tier.name] = 1e6 * (time.perf_counter() - start) / len(held)
    pool.release([target])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=None, help="trace prefix (default: all)")
    ap.add_argument("--cache-share", type=float, default=0.25)
    ap.add_argument("--host-share", type=float, default=0.5)
    ap.add_argument("--disk-share", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(results_file("engine", "offload.json")))
    args = ap.parse_args()

    model = ensure_model()
    probe = LLM(model, num_kv_blocks=8)
    vocab = probe.engine.model_config.vocab_size
    block_bytes = KVOffload.block_bytes(probe.engine.runner.kv_cache)
    del probe
    prompts, working_set = trace_prompts(args.requests or 10**6, vocab)
    longest = max(len(p) for p in prompts) // BLOCK + 2
    cache = max(longest, int(args.cache_share * working_set))
    mib = block_bytes / (1 << 20)
    configs = {
        f"cache-{args.cache_share:.0%}": {"num_kv_blocks": cache},
        f"cache-{args.cache_share:.0%}+tiers": {
            "num_kv_blocks": cache,
            "kv_offload_host_bytes": int(args.host_share * working_set) * block_bytes,
            "kv_offload_disk_bytes": int(args.disk_share * working_set) * block_bytes,
        },
        "unbounded": {"num_kv_blocks": working_set + longest},
    }
    results: dict = {
        "requests": len(prompts),
        "working_set_blocks": working_set,
        "block_tokens": BLOCK,
        "block_mib": mib,
        "cache_blocks": cache,
        "machine": platform.processor() or platform.machine(),
        "configs": {},
    }
    for name, kwargs in configs.items():
        llm = LLM(model, num_threads=args.threads, max_num_batched_tokens=8192, **kwargs)
        llm.generate([[5] * 40], ONE_TOKEN)  # first-call costs out of the replay
        results["configs"][name] = {"engine": kwargs, **replay(llm, prompts)}
        print(name, json.dumps(results["configs"][name]), flush=True)
        del llm
    base = results["configs"][f"cache-{args.cache_share:.0%}"]
    results["recompute_us_per_block"] = 1e6 * base["wall_s"] / base["computed_tokens"] * BLOCK
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


def print_table(r: dict) -> None:
    print(
        f"\n{r['requests']} requests, working set {r['working_set_blocks']} blocks of "
        f"{r['block_tokens']} tokens ({r['block_mib']:.3f} MiB each), device cache "
        f"{r['cache_blocks']} blocks"
    )
    print(f"{'config':<18} {'hit rate':>9} {'TTFT mean':>10} {'p50':>8} {'p90':>8} {'wall s':>7}")
    for name, c in r["configs"].items():
        print(
            f"{name:<18} {c['prefix_hit_rate']:>9.3f} {c['ttft_mean_ms']:>8.1f}ms "
            f"{c['ttft_p50_ms']:>6.1f}ms {c['ttft_p90_ms']:>6.1f}ms {c['wall_s']:>7.1f}"
        )
        for tier, s in c.get("tiers", {}).items():
            cost = c["restore_us_per_block"].get(tier, float("nan"))
            print(f"  {tier}: {s} restore {cost:.1f} us/block")
    print(f"recompute: {r['recompute_us_per_block']:.1f} us/block (cache-only run)")


if __name__ == "__main__":
    main()
