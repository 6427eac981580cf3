"""Eight LoRA adapters served beside the base model, against the base model alone: what
serving requests spread over adapters costs, and whether each adapter keeps its prefix hits.

    python -m bench.serving.lora                          # ~5 minutes
    python -m bench.serving.lora --rate 2 --duration 30

The workload is `--adapters` applications, each with its own system prompt of
`--prefix-tokens` shared by all its requests and `--prompt-tokens` fresh ones after it,
`--output-tokens` each, Poisson at `--rate` req/s in all (past what the pools serve, so the
throughput is the servers'). The same requests at the same times go to two servers:

  base   baton serve, every request to the base model
  lora   baton serve --lora-modules with one adapter per application (rank `--rank`, every
         projection; PEFT's save_pretrained, random weights), each application's requests
         to its adapter: a step batches requests of several adapters (engine/lora)

Per configuration: output tokens per second, TTFT p50 / p99, and the prompt tokens served
from the prefix cache per application (an adapter's KV is its own, so its hits come from its
own requests only). Writes bench/results/serving/lora.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
from pathlib import Path
from typing import Any

from bench.paths import results_file
from loadgen import workloads as wl
from loadgen.client import run_load
from loadgen.compare import LOGS, ensure_bench_model
from loadgen.metrics import RequestResult
from loadgen.run import served_model
from loadgen.server import ServerProcess
from loadgen.traces import TraceRequest

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(model_dir: Path, count: int, rank: int, out: Path) -> list[tuple[str, Path]]:
    """`count` PEFT adapters of the model (random A and B), made once per rank."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    made = []
    for i in range(count):
        folder = out / f"r{rank}-{i}"
        if not (folder / "adapter_config.json").exists():
            torch.manual_seed(i)
            base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            config = LoraConfig(r=rank, target_modules=TARGETS, init_lora_weights=False)
            model = get_peft_model(base, config)
            model.save_pretrained(folder)
        made.append((f"app{i}", folder))
    return made


def arrivals(args: argparse.Namespace) -> dict[int, list[TraceRequest]]:
    """Each application's requests: its system prompt, then fresh tokens."""
    rng = random.Random(args.seed)
    space = wl.TokenSpace(args.token_low, args.token_low + 2000)
    prefixes = [[rng.randrange(space.low, space.high) for _ in range(args.prefix_tokens)]
                for _ in range(args.adapters)]  # fmt: skip
    out: dict[int, list[TraceRequest]] = {i: [] for i in range(args.adapters)}
    t = 0.0
    while (t := t + rng.expovariate(args.rate)) < args.duration:
        app = rng.randrange(args.adapters)
        own = [rng.randrange(space.low, space.high) for _ in range(args.prompt_tokens)]
        out[app].append(TraceRequest.of_prompt(t, prefixes[app] + own, args.output_tokens))
    return out


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def summary(results: list[RequestResult], sent: int, duration_s: float) -> dict[str, Any]:
    done = [r for r in results if r.ok and r.ttft_s is not None]
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    prompt = sum(r.num_prompt_tokens for r in done)
    return {
        "sent": sent,
        "completed": len(done),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "output_tokens_per_s": sum(r.num_output_tokens for r in done) / duration_s,
        "prompt_tokens": prompt,
        "cached_prompt_tokens": sum(r.num_cached_tokens for r in done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }


async def run_config(
    name: str,
    serve_args: list[str],
    model_dir: Path,
    load: dict[int, list[TraceRequest]],
    adapters: list[str] | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    with ServerProcess(
        [*serve_args, "--model", str(model_dir)], LOGS / f"lora_{name}.log"
    ) as server:
        base = await served_model(server.url)
        models = adapters or [base] * len(load)
        warm = wl.fixed_lengths(2, 16, 4, wl.TokenSpace(args.token_low, args.token_low + 1))
        await asyncio.gather(*(run_load(server.url, m, warm, progress=False) for m in models))
        runs = await asyncio.gather(*(
            run_load(server.url, models[app], reqs, max_duration_s=args.duration + 5,
                     drain_timeout_s=args.drain_timeout, progress=False, label=f"{name} {app}")
            for app, reqs in load.items()
        ))  # fmt: skip
    duration = max(run.duration_s for run in runs)
    apps = {f"app{app}": summary(run.results, len(load[app]), run.duration_s)
            for app, run in zip(load, runs, strict=True)}  # fmt: skip
    every = [r for run in runs for r in run.results]
    return {
        "config": name,
        "serve_args": serve_args,
        "all": summary(every, sum(len(v) for v in load.values()), duration),
        "apps": apps,
        "load_avg_1m": os.getloadavg()[0],
    }


def table(doc: dict[str, Any]) -> str:
    lines = [
        "| config | sent | completed | tok/s | TTFT p50 / p99 s | cached prompt share | "
        "apps' cached share, min .. max |",
        "| --- | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for run in doc["runs"]:
        a = run["all"]
        shares = [s["cached_prompt_tokens"] / s["prompt_tokens"]
                  for s in run["apps"].values() if s["prompt_tokens"]]  # fmt: skip
        p50, p99 = a["ttft_p50_s"], a["ttft_p99_s"]
        ttft = "-" if p50 is None else f"{p50:.2f} / {p99:.2f}"
        share = a["cached_prompt_tokens"] / a["prompt_tokens"] if a["prompt_tokens"] else 0.0
        spread = f"{100 * min(shares):.0f} .. {100 * max(shares):.0f}%" if shares else "-"
        row = [run["config"], a["sent"], a["completed"], f"{a['output_tokens_per_s']:.1f}", ttft,
               f"{100 * share:.0f}%", spread]  # fmt: skip
        lines.append("| " + " | ".join(map(str, row)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the 20M bench model")
    p.add_argument("--pools", default="1,1", help="prefill,decode workers")
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rate", type=float, default=4.0, help="req/s over all applications")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--prefix-tokens", type=int, default=192)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--drain-timeout", type=float, default=120.0)
    p.add_argument("--configs", default="base,lora", help="in this order")
    p.add_argument("--token-low", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adapter-dir", default="/tmp/baton-bench-adapters")
    p.add_argument("--out", default=str(results_file("serving", "lora.json")))
    args = p.parse_args(argv)
    prefill, decode = (int(x) for x in args.pools.split(","))
    model_dir = ensure_bench_model(args.model)
    made = make_adapters(model_dir, args.adapters, args.rank, Path(args.adapter_dir))
    serve = ["--prefill", str(prefill), "--decode", str(decode), "--threads", "1",
             "--max-num-seqs", "16", "--max-num-batched-tokens", "512"]  # fmt: skip
    modules = ",".join(f"{name}={folder}" for name, folder in made)
    configs = {
        "base": (serve, None),
        "lora": ([*serve, "--lora-modules", modules, "--max-lora-rank", str(args.rank)],
                 [name for name, _ in made]),
    }  # fmt: skip
    chosen = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in configs]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(configs)})")
    load = arrivals(args)
    runs = [asyncio.run(run_config(c, *configs[c][:1], model_dir, load, configs[c][1], args))
            for c in chosen]  # fmt: skip
    doc = {"args": vars(args), "runs": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
