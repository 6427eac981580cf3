"""Quantized KV cache benchmark: int8 and fp8 (e4m3) KV against the model's float32,
same process, same run.

    python -m bench.engine.kv_quant              # trained checkpoint (trains it once, cached)

Measured:
  quality  perplexity of the trained checkpoint (`baton make-tiny-model --train`) on held-out
           standard-library text, through the engine's prompt logprobs, with prefill chunks of
           `--chunk` tokens: every chunk after the first attends to its context read back
           from the (quantized) cache, so all but the first chunk's scores see the
           quantization. (In one chunk a prompt attends to its own unquantized K/V, and the
           cache's format would not show.)
  bytes    bytes per block in the cache, which is also what the KV transfer moves per block
           and what the front door counts in baton:kv_transfer_bytes (the layout's
           block_bytes_all_layers), for the trained checkpoint and for the `small` preset.
  speed    decode tokens/s at batch 1 on the `small` preset (a 512-token prompt, 64 new
           tokens), the engines alternating, `--repeat` times each; median.

Writes bench/results/engine/kv_quant.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import torch

from bench.engine.quant import decode_rate, heldout_windows, perplexity
from bench.paths import results_file
from engine.llm import LLM

KV_DTYPES = ("auto", "int8", "fp8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trained", default=None, help="trained checkpoint (default: cached one)")
    p.add_argument("--windows", type=int, default=48, help="held-out windows for perplexity")
    p.add_argument("--window-len", type=int, default=512)
    p.add_argument("--chunk", type=int, default=32, help="prefill chunk (tokens per step)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(results_file("engine", "kv_quant.json")))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.trained is None:
        from engine.tiny_model.train import trained_checkpoint

        args.trained = str(trained_checkpoint())

    quality, block_bytes = {}, {}
    for kv in KV_DTYPES:
        llm = LLM(args.trained, kv_cache_dtype=kv, num_kv_blocks=512,
                  max_num_batched_tokens=args.chunk)  # fmt: skip
        windows = heldout_windows(llm, args.window_len, args.windows)
        quality[kv] = perplexity(llm, windows)
        block_bytes[kv] = {"trained": llm.engine.runner.kv_layout.block_bytes_all_layers}
        del llm
    tokens = sum(len(w) - 1 for w in windows)

    with tempfile.TemporaryDirectory() as scratch:
        from engine.tiny_model import make_tiny_model

        model = make_tiny_model(Path(scratch) / "small", preset="small")
        engines = {kv: LLM(model, kv_cache_dtype=kv, num_kv_blocks=128) for kv in KV_DTYPES}
        for kv, llm in engines.items():
            block_bytes[kv]["small"] = llm.engine.runner.kv_layout.block_bytes_all_layers
        prompt = [(i * 7919) % 1000 + 10 for i in range(512)]
        rates: dict[str, list[float]] = {kv: [] for kv in KV_DTYPES}
        for llm in engines.values():
            decode_rate(llm, prompt, 8)  # warm-up
        for _ in range(args.repeat):
            for kv, llm in engines.items():
                rates[kv].append(decode_rate(llm, prompt, 64))

    speed = {kv: statistics.median(r) for kv, r in rates.items()}
    base = "auto"
    result = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "trained_model": args.trained,
        "chunk_tokens": args.chunk,
        "perplexity": quality,
        "perplexity_tokens": tokens,
        "perplexity_ratio": {kv: quality[kv] / quality[base] for kv in KV_DTYPES},
        "block_bytes": block_bytes,
        "bytes_ratio": {
            kv: block_bytes[kv]["small"] / block_bytes[base]["small"] for kv in KV_DTYPES
        },
        "decode_tokens_per_s": speed,
        "decode_runs": rates,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"| KV cache | perplexity ({tokens} tokens, chunks of {args.chunk}) | ratio "
          "| bytes/block (small) | ratio | decode tok/s (small, batch 1) |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for kv in KV_DTYPES:
        name = "float32" if kv == base else kv
        print(f"| {name} | {quality[kv]:.3f} | {result['perplexity_ratio'][kv]:.4f} "
              f"| {block_bytes[kv]['small']} | {result['bytes_ratio'][kv]:.3f} "
              f"| {speed[kv]:.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
