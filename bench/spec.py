"""Speculative decoding benchmark (issue 24): prompt lookup (n-gram) against plain decoding,
batch 1, greedy, the same engine settings, the same run.

    python -m bench.spec                   # trained checkpoint (trains it once, cached)
    python -m bench.spec --samples 8 --repeat 3

Two workloads on held-out standard-library functions the model never trained on, the prompt
holding a function and asking for it again ("# Edited:"):
  editing   greedy: the answer is mostly in the prompt, as in code editing; drafts should
            be accepted;
  sampled   the same prompts, sampled (temperature 1, seeded) instead of greedy: the
            output wanders off the prompt, so drafts are mostly rejected (the back-off is
            what keeps this near plain decoding's speed).

Per workload: decode tokens/s after the first token (the two engines alternate, `--repeat`
times; the median counts), the speculative engine's acceptance (accepted / drafted) and
whether every output is identical to plain decoding's. Writes bench/results/spec.json.
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

from core.sampling import SamplingParams
from engine.llm import LLM

RESULTS = Path(__file__).parent / "results"


def functions(text: str, count: int, min_chars: int = 400, max_chars: int = 1200) -> list[str]:
    """Top-level functions or methods of a module's source, of a size a prompt can hold."""
    found = re.findall(r"(?ms)^( *def .*?)(?=^ *def |^class |\Z)", text)
    return [f for f in found if min_chars <= len(f) <= max_chars][:count]


def prompts(llm: LLM, count: int) -> list[list[int]]:
    from engine.tiny_model.train import heldout_text

    return [
        llm.tokenizer.encode(f"# Original:\n{body}\n# Edited:\n", add_special_tokens=False)
        for body in functions(heldout_text(), count)
    ]


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
    batch = prompts(engines["plain"], args.samples)
    temperature = 0.0 if workload == "editing" else 1.0
    spec_totals = engines["ngram"].engine.step_totals
    drafted, accepted = spec_totals.draft_tokens, spec_totals.accepted_tokens
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
    drafted = spec_totals.draft_tokens - drafted
    accepted = spec_totals.accepted_tokens - accepted
    return {
        "prompts": len(batch),
        "decode_tokens_per_s": median,
        "runs": rates,
        "speedup": median["ngram"] / median["plain"],
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "identical_to_plain": identical,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the trained checkpoint (cached)")
    p.add_argument("--samples", type=int, default=6, help="prompts per workload")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(RESULTS / "spec.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model is None:
        from engine.tiny_model.train import trained_checkpoint

        args.model = str(trained_checkpoint())
    # No prefix caching: a repeated prompt must cost the same each time for both engines.
    common = {"num_kv_blocks": 512, "enable_prefix_caching": False}
    engines = {
        "plain": LLM(args.model, **common),
        "ngram": LLM(args.model, speculative="ngram",
                     num_speculative_tokens=args.num_speculative_tokens, **common),
    }  # fmt: skip
    results = {w: run_workload(engines, w, args) for w in ("editing", "sampled")}
    doc = {
        "machine": platform.processor() or platform.machine(),
        "model": args.model,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "num_speculative_tokens": args.num_speculative_tokens,
        "workloads": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print("| workload | plain tok/s | ngram tok/s | speedup | acceptance | identical |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        tps = r["decode_tokens_per_s"]
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"| {name} | {tps['plain']:.1f} | {tps['ngram']:.1f} | {r['speedup']:.2f}x | "
              f"{acc} | {r['identical_to_plain']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
