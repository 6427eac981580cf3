"""Quantization benchmark (issue 24): INT8 weight-only against float32, same process, same run.

    python -m bench.quant                        # trained checkpoint (trains it once, cached)
    python -m bench.quant --speed-model models/small --repeat 5

Two measurements:
  quality  perplexity of the trained checkpoint (`baton make-tiny-model --train`) on held-out
           standard-library text, through the engine (prompt logprobs), float32 vs int8;
  speed    decode tokens/s at batch 1 (a 128-token prompt, 128 new tokens; the rate after
           the first token) on a bigger checkpoint, where weight bytes dominate a step: the
           `small` preset (~125M, random weights: speed does not depend on the values). The
           two engines alternate, `--repeat` times each, and the median counts.

Writes bench/results/quant.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from core.sampling import SamplingParams
from engine.llm import LLM

RESULTS = Path(__file__).parent / "results"
MODES = {"float32": None, "int8": "int8"}


def perplexity(llm: LLM, windows: list[list[int]]) -> float:
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    total, count = 0.0, 0
    for out in llm.generate(windows, params):
        scored = [lp.logprob for lp in out.prompt_logprobs or [] if lp is not None]
        total += sum(scored)
        count += len(scored)
    return math.exp(-total / count)


def heldout_windows(llm: LLM, length: int, count: int) -> list[list[int]]:
    from engine.tiny_model.train import heldout_text

    ids = llm.tokenizer.encode(heldout_text(), add_special_tokens=False)
    step = max(length, (len(ids) - length) // count)
    return [ids[s : s + length] for s in range(0, step * count, step) if s + length <= len(ids)]


def decode_rate(llm: LLM, prompt: list[int], new_tokens: int) -> float:
    """Tokens/s after the first token, batch 1 (the prefill is timed apart and taken off)."""
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    first = time.perf_counter() - start
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=new_tokens + 1, temperature=0.0,
                                          ignore_eos=True))  # fmt: skip
    return new_tokens / (time.perf_counter() - start - first)


def _speed_model(given: str | None, scratch: Path) -> Path:
    if given:
        return Path(given)
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(scratch / "small", preset="small")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trained", default=None, help="trained checkpoint (default: cached one)")
    p.add_argument("--speed-model", default=None, help="default: the small preset, made here")
    p.add_argument("--windows", type=int, default=48, help="held-out windows for perplexity")
    p.add_argument("--window-len", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(RESULTS / "quant.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.trained is None:
        from engine.tiny_model.train import trained_checkpoint

        args.trained = str(trained_checkpoint())

    quality = {}
    for name, method in MODES.items():
        llm = LLM(args.trained, quantization=method, num_kv_blocks=512)
        windows = heldout_windows(llm, args.window_len, args.windows)
        quality[name] = perplexity(llm, windows)
        del llm
    tokens = sum(len(w) - 1 for w in windows)

    with tempfile.TemporaryDirectory() as scratch:
        model = _speed_model(args.speed_model, Path(scratch))
        engines = {n: LLM(model, quantization=m, num_kv_blocks=64) for n, m in MODES.items()}
        prompt = [(i * 7919) % 1000 + 10 for i in range(128)]
        rates: dict[str, list[float]] = {n: [] for n in MODES}
        for llm in engines.values():
            decode_rate(llm, prompt, 8)  # warm-up
        for _ in range(args.repeat):
            for name, llm in engines.items():
                rates[name].append(decode_rate(llm, prompt, 128))

    speed = {n: statistics.median(r) for n, r in rates.items()}
    result = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "trained_model": args.trained,
        "perplexity": quality,
        "perplexity_tokens": tokens,
        "perplexity_ratio": quality["int8"] / quality["float32"],
        "speed_model": str(args.speed_model or "small preset (random weights)"),
        "decode_tokens_per_s": speed,
        "decode_runs": rates,
        "speedup": speed["int8"] / speed["float32"],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"| weights | perplexity ({tokens} held-out tokens) | decode tok/s, batch 1 |")
    print("| --- | --- | --- |")
    for name in MODES:
        print(f"| {name} | {quality[name]:.3f} | {speed[name]:.1f} |")
    print(f"int8 / float32: perplexity {result['perplexity_ratio']:.4f}x, "
          f"decode {result['speedup']:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
