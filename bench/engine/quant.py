"""Quantization benchmark: INT8 weight-only and W8A8 against float32, same process,
same run.

    python -m bench.engine.quant                 # trained checkpoint (trains it once, cached)
    python -m bench.engine.quant --speed-model models/small --repeat 5

Three measurements:
  quality  perplexity of the trained checkpoint (`baton make-tiny-model --train`) on held-out
           standard-library text, through the engine (prompt logprobs), per mode;
  decode   tokens/s at batch 1 (a 128-token prompt, 128 new tokens; the rate after the
           first token) on a bigger checkpoint, where weight bytes dominate a step: the
           `small` preset (~125M, random weights: speed does not depend on the values);
  prefill  prompt tokens/s of 4 fresh 512-token prompts at once (one output token each),
           same checkpoint: GEMMs of hundreds of rows, where compute dominates;
  loading  peak resident memory of a fresh process that loads that checkpoint: float32,
           quantized on load, and the INT8 checkpoint `baton quantize` writes of it.
The engines alternate, `--repeat` times each, and the median counts.

Writes bench/results/engine/quant.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.paths import results_file
from core.sampling import SamplingParams
from engine.llm import LLM

MODES = {"float32": None, "int8": "int8", "w8a8": "w8a8"}


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


def prefill_rate(llm: LLM, prompts: list[list[int]]) -> float:
    """Prompt tokens/s of `prompts` prefilled together, one output token each."""
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    return sum(len(p) for p in prompts) / (time.perf_counter() - start)


def fresh_prompts(seed: int, count: int = 4, length: int = 512) -> list[list[int]]:
    """Prompts no earlier run has cached."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(10, 1000, (count, length), generator=gen).tolist()


_PEAK_RSS = """
import sys
from engine.llm import LLM
def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))
base = kib("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark restarts from here (Linux)
LLM(sys.argv[1], quantization=sys.argv[2] or None, num_kv_blocks=16)
print(base, kib("VmHWM:"))
"""


def load_peak_mib(model_dir: Path, quantization: str | None) -> tuple[float, float]:
    """(resident memory once the engine is imported, its peak while the model loads), MiB,
    in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(model_dir), quantization or ""],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    base, peak = out.stdout.split()[-2:]
    return int(base) / 1024, int(peak) / 1024


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
    p.add_argument("--out", default=str(results_file("engine", "quant.json")))
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
        engines = {n: LLM(model, quantization=m, num_kv_blocks=160) for n, m in MODES.items()}
        prompt = [(i * 7919) % 1000 + 10 for i in range(128)]
        rates: dict[str, list[float]] = {n: [] for n in MODES}
        prefill: dict[str, list[float]] = {n: [] for n in MODES}
        for i, llm in enumerate(engines.values()):
            decode_rate(llm, prompt, 8)  # warm-up
            prefill_rate(llm, fresh_prompts(-1 - i, count=1))
        for r in range(args.repeat):
            for i, (name, llm) in enumerate(engines.items()):
                rates[name].append(decode_rate(llm, prompt, 128))
                prefill[name].append(prefill_rate(llm, fresh_prompts(r * len(MODES) + i)))

        from engine.int8_checkpoint import write_int8_checkpoint

        int8_dir = write_int8_checkpoint(model, Path(scratch) / "int8")
        loads = {
            "float32": load_peak_mib(model, None),
            "int8 on load": load_peak_mib(model, "int8"),
            "int8 checkpoint": load_peak_mib(int8_dir, None),
        }

    speed = {n: statistics.median(r) for n, r in rates.items()}
    prefill_speed = {n: statistics.median(r) for n, r in prefill.items()}
    result = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "trained_model": args.trained,
        "perplexity": quality,
        "perplexity_tokens": tokens,
        "perplexity_ratio": {n: quality[n] / quality["float32"] for n in MODES},
        "speed_model": str(args.speed_model or "small preset (random weights)"),
        "decode_tokens_per_s": speed,
        "decode_runs": rates,
        "speedup": {n: speed[n] / speed["float32"] for n in MODES},
        "prefill_tokens_per_s": prefill_speed,
        "prefill_runs": prefill,
        "prefill_speedup": {n: prefill_speed[n] / prefill_speed["float32"] for n in MODES},
        "load_peak_rss_mib": {n: {"import": b, "loaded": p} for n, (b, p) in loads.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"| mode | perplexity ({tokens} held-out tokens) | decode tok/s, batch 1 | "
          "prefill tok/s, 4 x 512 |")  # fmt: skip
    print("| --- | --- | --- | --- |")
    for n in MODES:
        print(f"| {n} | {quality[n]:.3f} ({result['perplexity_ratio'][n]:.4f}x) | "
              f"{speed[n]:.1f} ({result['speedup'][n]:.2f}x) | "
              f"{prefill_speed[n]:.0f} ({result['prefill_speedup'][n]:.2f}x) |")  # fmt: skip
    for n, (base, peak) in loads.items():
        print(f"loading, {n}: peak RSS {peak:.0f} MiB ({peak - base:.0f} over the import)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
