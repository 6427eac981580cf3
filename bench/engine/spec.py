"""Speculative decoding benchmark: prompt lookup (n-gram) and a draft model
against plain decoding, batch 1, the same engine settings, the same run.

    python -m bench.engine.spec          # trained checkpoint and its distilled draft (cached)
    python -m bench.engine.spec --samples 8 --repeat 3
    python -m bench.engine.spec --model models/smollm2-135m-instruct --workloads summarize \
        --out bench/results/engine/spec_smollm2.json       # a chat model, prompt lookup only

Three workloads on held-out standard-library functions the models never trained on:
  editing     the prompt holds a function and asks for it again ("# Edited:"), greedy: the
              answer is mostly in the prompt, as in code editing;
  sampled     the same prompts, sampled (temperature 1, seeded): the output wanders off
              the prompt, so prompt lookup's drafts are mostly rejected (its back-off keeps
              it near plain decoding's speed); the draft model's draws share the target's
              noise, so many of its drafts still hold;
  completion  the first third of a function, continued greedily: nothing to copy from,
              what a draft model is for;
  summarize   a chat model asked to summarize a standard-library module's docstring,
              greedy: a summary reuses the text's phrases, what prompt lookup is for.

Per workload and method: decode tokens/s after the first token (the engines alternate,
`--repeat` times; the median counts), acceptance (accepted / drafted) and whether every
output is identical to plain decoding's. Writes bench/results/engine/spec.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import time
from pathlib import Path

import torch

from bench.paths import results_file
from core.sampling import SamplingParams
from engine.llm import LLM


def functions(text: str, count: int, min_chars: int = 400, max_chars: int = 1200) -> list[str]:
    """Top-level functions or methods of a module's source, of a size a prompt can hold."""
    found = re.findall(r"(?ms)^( *def .*?)(?=^ *def |^class |\Z)", text)
    return [f for f in found if min_chars <= len(f) <= max_chars][:count]


def docstrings(count: int, min_chars: int = 800, max_chars: int = 3000) -> list[str]:
    """Module docstrings of the standard library, of a size a prompt can hold, in a fixed
    order."""
    import ast
    import sysconfig

    found = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8", errors="replace")))
        if doc and min_chars <= len(doc) <= max_chars:
            found.append(doc)
    return found[:count]


def prompts(llm: LLM, count: int, workload: str = "editing") -> list[list[int]]:
    from engine.tiny_model.train import heldout_text

    if workload == "summarize":
        asks = [f"Summarize this text in three sentences.\n\n{doc}" for doc in docstrings(count)]
        return [llm.tokenizer.encode_chat([{"role": "user", "content": a}]) for a in asks]
    bodies = functions(heldout_text(), count)
    if workload == "completion":
        texts = [body[: len(body) // 3] for body in bodies]
    else:
        texts = [f"# Original:\n{body}\n# Edited:\n" for body in bodies]
    return [llm.tokenizer.encode(text, add_special_tokens=False) for text in texts]


def timed(
    llm: LLM, prompt: list[int], max_tokens: int, temperature: float
) -> tuple[float, list[int]]:
    """(tokens/s after the first token, the tokens) at batch 1."""
    first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([prompt], first)
    ttft = time.perf_counter() - start
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=11,
                            ignore_eos=True)  # fmt: skip
    start = time.perf_counter()
    out = llm.generate([prompt], params)[0]
    return (max_tokens - 1) / (time.perf_counter() - start - ttft), list(out.token_ids)


def run_workload(engines: dict[str, LLM], workload: str, args: argparse.Namespace) -> dict:
    batch = prompts(engines["plain"], args.samples, workload)
    temperature = 1.0 if workload == "sampled" else 0.0
    before = {name: _counts(llm) for name, llm in engines.items()}
    rates: dict[str, list[float]] = {name: [] for name in engines}
    reference: dict[int, list[int]] = {}  # plain decoding's tokens, per prompt
    identical = True
    for _ in range(args.repeat):
        for name in engines:
            per_prompt = []
            for i, prompt in enumerate(batch):
                rate, tokens = timed(engines[name], prompt, args.max_tokens, temperature)
                per_prompt.append(rate)
                if name == "plain":
                    reference[i] = tokens
                else:
                    identical &= tokens == reference[i]
            rates[name].append(statistics.mean(per_prompt))
    median = {name: statistics.median(r) for name, r in rates.items()}
    methods = {}
    for name, llm in engines.items():
        if name == "plain":
            continue
        drafted, accepted = (a - b for a, b in zip(_counts(llm), before[name], strict=True))
        methods[name] = {
            "speedup": median[name] / median["plain"],
            "drafted": drafted,
            "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None,
        }
    return {
        "prompts": len(batch),
        "decode_tokens_per_s": median,
        "runs": rates,
        "methods": methods,
        "identical_to_plain": identical,
    }


def _counts(llm: LLM) -> tuple[int, int]:
    totals = llm.engine.step_totals
    return totals.draft_tokens, totals.accepted_tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the trained checkpoint (cached)")
    p.add_argument(
        "--draft-model",
        default=None,
        help="default: the draft preset distilled from the default model (cached)",
    )
    p.add_argument("--samples", type=int, default=6, help="prompts per workload")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workloads", nargs="+", default=["editing", "sampled", "completion"],
                   choices=["editing", "sampled", "completion", "summarize"])  # fmt: skip
    p.add_argument("--out", default=str(results_file("engine", "spec.json")))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from engine.tiny_model.train import draft_checkpoint, trained_checkpoint

    if args.model is None:  # the trained checkpoint, and its distilled draft
        args.model = str(trained_checkpoint())
        args.draft_model = args.draft_model or str(draft_checkpoint())
    # No prefix caching: a repeated prompt must cost the same each time for every engine.
    common = {"num_kv_blocks": 512, "enable_prefix_caching": False,
              "num_speculative_tokens": args.num_speculative_tokens}  # fmt: skip
    engines = {
        "plain": LLM(args.model, **common),
        "ngram": LLM(args.model, speculative="ngram", **common),
    }
    if args.draft_model:  # a given model has no draft unless one is named
        engines["draft"] = LLM(args.model, speculative="draft",
                               speculative_model=args.draft_model, **common)  # fmt: skip
    results = {w: run_workload(engines, w, args) for w in args.workloads}
    doc = {
        "machine": platform.processor() or platform.machine(),
        "model": args.model,
        "draft_model": args.draft_model,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "num_speculative_tokens": args.num_speculative_tokens,
        "workloads": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print("| workload | method | tok/s | plain tok/s | speedup | acceptance | identical |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        tps = r["decode_tokens_per_s"]
        for method, m in r["methods"].items():
            acc = "-" if m["acceptance"] is None else f"{m['acceptance']:.2f}"
            print(f"| {name} | {method} | {tps[method]:.1f} | {tps['plain']:.1f} | "
                  f"{m['speedup']:.2f}x | {acc} | {r['identical_to_plain']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
