"""Swap preemption benchmark: a batch that outgrows the KV cache, served by
preempting (recompute) against preempting with a host tier (swap), and a cache that needs
no preemption; same process, same run.

    python -m bench.engine.swap
    python -m bench.engine.swap --requests 32 --cache-share 0.3 --repeat 3

`--requests` prompts of `--prompt-len` random tokens each ask for `--max-tokens` tokens at
once; the cache holds `--cache-share` of the blocks they need at their longest, so running
requests are preempted as they grow. The model is the `trained` preset's shape with random
weights (speed does not depend on them), 2 threads. Reported per configuration (median of
`--repeat` alternating runs): preemptions, tokens computed (prefill chunks + decode rows;
the roomy cache's count is the work there is, anything above it was recomputed), wall time
and output tokens/s. The output is checked identical across configurations.

Writes bench/results/engine/swap.json and prints a table.
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

import torch

from bench.paths import results_file
from core.sampling import SamplingParams
from engine.llm import LLM

MODEL = Path(tempfile.gettempdir()) / "baton-bench-swap-model"
BLOCK = 16


def ensure_model() -> Path:
    if not (MODEL / "config.json").exists():
        from engine.tiny_model import make_tiny_model

        make_tiny_model(MODEL, arch="llama", preset="trained")
    return MODEL


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict:
    engine = llm.engine
    before = engine.step_totals.prefill_tokens + engine.step_totals.decode_rows
    preemptions = engine.scheduler.num_preemptions
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - start
    totals = engine.step_totals
    return {
        "wall_s": wall,
        "computed_tokens": totals.prefill_tokens + totals.decode_rows - before,
        "preemptions": engine.scheduler.num_preemptions - preemptions,
        "output_tokens_per_s": sum(len(o.token_ids) for o in outs) / wall,
        "tokens": [o.token_ids for o in outs],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--cache-share", type=float, default=0.3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(results_file("engine", "swap.json")))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = ensure_model()
    rng = random.Random(0)
    prompts = [
        [rng.randrange(3, 2000) for _ in range(args.prompt_len)] for _ in range(args.requests)
    ]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    needed = args.requests * -(-(args.prompt_len + args.max_tokens) // BLOCK)
    small = max(int(needed * args.cache_share), -(-(args.prompt_len + args.max_tokens) // BLOCK))
    common = dict(max_num_seqs=args.requests, max_num_batched_tokens=512)
    engines = {
        "recompute": LLM(model, num_kv_blocks=small, **common),
        "swap (host tier)": LLM(
            model, num_kv_blocks=small, kv_offload_host_bytes=1 << 30, **common
        ),
        "no preemption": LLM(model, num_kv_blocks=needed + 8, **common),
    }
    for llm in engines.values():
        llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for _ in range(args.repeat):
        for name, llm in engines.items():
            llm.engine.kv.pool.reset_prefix_cache()  # each run starts cold, as the first did
            runs[name].append(run(llm, prompts, params))

    reference = runs["no preemption"][0]["tokens"]
    result = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "requests": args.requests,
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "cache_blocks": small,
        "blocks_needed": needed,
        "configs": {},
    }
    print(f"{args.requests} requests x ({args.prompt_len} + {args.max_tokens}) tokens, "
          f"cache {small} of {needed} blocks")  # fmt: skip
    print("| configuration | preemptions | tokens computed | wall s | output tok/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, rs in runs.items():
        assert all(r["tokens"] == reference for r in rs), f"{name}: output differs"
        summary = {
            key: statistics.median(r[key] for r in rs)
            for key in ("wall_s", "computed_tokens", "preemptions", "output_tokens_per_s")
        }
        summary["runs"] = [{k: v for k, v in r.items() if k != "tokens"} for r in rs]
        result["configs"][name] = summary
        print(f"| {name} | {summary['preemptions']:.0f} | {summary['computed_tokens']:.0f} "
              f"| {summary['wall_s']:.2f} | {summary['output_tokens_per_s']:.0f} |")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
