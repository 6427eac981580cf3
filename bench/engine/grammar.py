"""Structured outputs' cost: decode TPOT with a JSON-schema grammar against the
same requests without one, at batch 1 and 16, Baton and vLLM (offline engines, same
checkpoint, same threads, same run); and the time to compile a new schema, then to find it
in the cache.

    python -m bench.engine.grammar                             # small preset (~125M), 2 threads
    python -m bench.engine.grammar --vllm-python V/bin/python  # add vLLM (bench/engine/offline.py)
    python -m bench.engine.grammar --repeat 3                  # best of 3 alternating runs

Every request gets its own schema: an object holding an array of at least 64 records, each a
random nested object (tests.support.json_schemas), so the grammar never completes within
`--max-tokens` and a constrained request runs exactly as long as a free one. Compact JSON (no
optional whitespace) on both engines, greedy, `ignore_eos`. TPOT is the mean over requests of
decode time / (tokens - 1); compile times are xgrammar's, through the engine's own cache.
Writes bench/results/engine/grammar.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.paths import results_file
from tests.support.json_schemas import random_schema

PROMPT_LEN = 64


def schema(i: int) -> dict[str, Any]:
    records = {"type": "array", "minItems": 64, "items": random_schema(random.Random(i))}
    return {"type": "object", "properties": {"records": records}, "required": ["records"]}


def prompts(batch: int, vocab: int) -> list[list[int]]:
    rng = random.Random(batch)
    return [[rng.randrange(3, vocab) for _ in range(PROMPT_LEN)] for _ in range(batch)]


def run_baton(model: str, batch: int, constrained: bool, max_tokens: int, threads: int) -> float:
    """Mean TPOT (s) of `batch` requests run together."""
    from core.structured import StructuredOutput
    from engine import LLM, SamplingParams

    llm = LLM(model, num_threads=threads, max_num_seqs=64, max_num_batched_tokens=768)
    vocab = llm.engine.model_config.vocab_size

    def params(i: int, n: int) -> SamplingParams:
        so = StructuredOutput.json_schema(schema(i), f"s{i}", disable_any_whitespace=True)
        return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True,
                              structured_outputs=so if constrained else None)  # fmt: skip

    batch_prompts = prompts(batch, vocab)
    # Warm up, and compile every schema: compile time is measured on its own (below).
    llm.generate(batch_prompts, [params(i, 2) for i in range(batch)])
    outs = llm.generate(batch_prompts, [params(i, max_tokens) for i in range(batch)])
    assert all(len(o.token_ids) == max_tokens for o in outs), "a grammar completed early"
    return statistics.mean(o.timings.decode_s / (max_tokens - 1) for o in outs)


def compile_times(model: str, count: int) -> dict[str, float]:
    """Median and worst first compile of `count` new schemas, and a cached lookup."""
    from core.structured import StructuredOutput
    from engine.config import ModelConfig
    from engine.grammar.cache import GrammarCache
    from engine.tokenizer import Tokenizer

    config = ModelConfig.from_dir(model)
    cache = GrammarCache(Tokenizer.from_dir(model), config, config.eos_token_ids)
    constraints = [
        StructuredOutput.json_schema(random_schema(random.Random(1000 + i)), f"c{i}")
        for i in range(count)
    ]
    cache.compiled(StructuredOutput.json_schema({"type": "object"}, "warm"))  # the compiler
    first, again = [], []
    for c in constraints:
        t = time.perf_counter()
        cache.compiled(c)
        first.append(time.perf_counter() - t)
        t = time.perf_counter()
        cache.compiled(c)
        again.append(time.perf_counter() - t)
    return {
        "compile_median_s": statistics.median(first),
        "compile_max_s": max(first),
        "cached_median_s": statistics.median(again),
        "count": count,
    }


_VLLM_SCRIPT = """
import json, os, sys, time

if __name__ == "__main__":  # vLLM spawns its engine processes, which re-import this file
    model, threads, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    job = json.loads(sys.stdin.read())
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    llm = LLM(model, dtype="float32", gpu_memory_utilization=0.5, enable_prefix_caching=False)
    result = {}
    for key, (batch_prompts, schemas) in job.items():
        def params(n, s):
            so = StructuredOutputsParams(json=s, disable_any_whitespace=True) if s else None
            return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True,
                                  structured_outputs=so)
        inputs = [{"prompt_token_ids": p} for p in batch_prompts]
        llm.generate(inputs, [params(2, s) for s in schemas])
        t = time.monotonic()
        llm.generate(inputs, [params(1, s) for s in schemas])
        ttft = time.monotonic() - t
        t = time.monotonic()
        outs = llm.generate(inputs, [params(max_tokens, s) for s in schemas])
        wall = time.monotonic() - t
        n = min(len(o.outputs[0].token_ids) for o in outs)
        result[key] = {"tpot": (wall - ttft) / (max_tokens - 1), "min_tokens": n}
    print("BATON_RESULT", json.dumps(result))
"""


def run_vllm(
    python: str, model: str, cases: list[tuple[int, bool]], max_tokens: int, threads: int,
    vocab: int,
) -> dict[str, float]:  # fmt: skip
    """TPOT per case key "<batch>/<constrained>", one vLLM process for all cases. Its
    per-request timings are not public offline, so TPOT is (wall - a 1-token run's wall) /
    (tokens - 1), the same for both cases."""
    job = {
        f"{b}/{c}": (prompts(b, vocab), [schema(i) if c else None for i in range(b)])
        for b, c in cases
    }
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_TARGET_DEVICE": "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "vllm_grammar.py"
        script.write_text(_VLLM_SCRIPT)
        proc = subprocess.run(
            [python, str(script), str(Path(model).resolve()), str(threads), str(max_tokens)],
            input=json.dumps(job), text=True, capture_output=True, env=env, timeout=3600,
        )  # fmt: skip
    if proc.returncode != 0:
        print(f"vLLM run failed: {proc.stderr[-2000:]}", file=sys.stderr)
        return {}
    line = next(x for x in proc.stdout.splitlines() if x.startswith("BATON_RESULT "))
    got = json.loads(line.removeprefix("BATON_RESULT "))
    for key, r in got.items():
        if r["min_tokens"] != max_tokens:
            print(f"vLLM {key}: a request stopped at {r['min_tokens']} tokens", file=sys.stderr)
    return {key: r["tpot"] for key, r in got.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--compile-count", type=int, default=20)
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument("--out", default=str(results_file("engine", "grammar.json")))
    args = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    if not (Path(args.model) / "config.json").exists():
        from engine.tiny_model import make_tiny_model

        make_tiny_model(args.model, arch="llama", preset="small", seed=0)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    cases = [(int(b), c) for b in args.batches.split(",") for c in (False, True)]
    baton: dict[str, float] = {}
    for _ in range(args.repeat):  # alternate free and constrained; keep each one's best
        for b, c in cases:
            tpot = run_baton(args.model, b, c, args.max_tokens, args.threads)
            key = f"{b}/{c}"
            baton[key] = min(baton.get(key, float("inf")), tpot)
            print(f"baton batch {b} {'grammar' if c else 'free'}: {tpot * 1e3:.1f} ms", flush=True)
    vllm: dict[str, float] = {}
    if args.vllm_python:
        for _ in range(args.repeat):
            got = run_vllm(args.vllm_python, args.model, cases, args.max_tokens, args.threads,
                           vocab)  # fmt: skip
            for key, tpot in got.items():
                vllm[key] = min(vllm.get(key, float("inf")), tpot)
    compiled = compile_times(args.model, args.compile_count)
    report(baton, vllm, compiled, args)
    return 0


def report(
    baton: dict[str, float], vllm: dict[str, float], compiled: dict[str, float],
    args: argparse.Namespace,
) -> None:  # fmt: skip
    print(f"\n{'batch':>5} {'system':8} {'free ms':>8} {'grammar ms':>10} {'slowdown':>9}")
    rows = []
    for system, tpots in (("baton", baton), ("vllm", vllm)):
        for b in sorted({int(k.split("/")[0]) for k in tpots}):
            free, constrained = tpots.get(f"{b}/False"), tpots.get(f"{b}/True")
            if free is None or constrained is None:
                continue
            slowdown = constrained / free - 1
            rows.append({"system": system, "batch": b, "tpot_free_s": free,
                         "tpot_grammar_s": constrained, "slowdown": slowdown})  # fmt: skip
            print(f"{b:5} {system:8} {free * 1e3:8.1f} {constrained * 1e3:10.1f} "
                  f"{slowdown * 100:+8.1f}%")  # fmt: skip
    print(
        f"\nnew schema: compile median {compiled['compile_median_s'] * 1e3:.1f} ms, worst "
        f"{compiled['compile_max_s'] * 1e3:.1f} ms ({compiled['count']} random schemas); "
        f"cached: {compiled['cached_median_s'] * 1e6:.0f} us"
    )
    out = {
        "model": args.model, "threads": args.threads, "max_tokens": args.max_tokens,
        "repeat": args.repeat, "rows": rows, "compile": compiled,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
