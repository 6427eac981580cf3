"""Decode GEMMs against the memory they read: how fast the engine's CPU linear kernels stream
a model's weights at a decode batch, against a plain streaming read of the same machine.

    python -m bench.engine.gemm_bandwidth [--rows 16] [--threads 2] [--dtype bfloat16]

The layer shapes are the `small` preset's (hidden 768, MLP 2,048, 12 layers, 4 KV heads of
64, vocabulary 32,000): per layer the fused QKV, the output projection, gate-and-up (through
the fused SiLU-and-mul where the engine fuses it) and down, then the LM head, each layer's
weights its own tensors, so a pass reads ~200 MB from DRAM as a decode step does. Best of 10
passes after 3 warm-ups; the streaming read is bench.engine.offline.memory_bandwidth. A decode step
at this batch cannot go faster than the weights' bytes over that bandwidth (plus its KV).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench.engine.offline import memory_bandwidth
from engine.layers import cpu_gemm

HIDDEN, MLP, LAYERS, KV, VOCAB = 768, 2048, 12, 256, 32000


def run(rows: int, threads: int, dtype: torch.dtype) -> dict[str, float]:
    torch.manual_seed(0)
    torch.set_num_threads(threads)

    def w(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, dtype=dtype)

    layers = [
        (w(HIDDEN + 2 * KV, HIDDEN), w(HIDDEN, HIDDEN), w(2 * MLP, HIDDEN), w(HIDDEN, MLP))
        for _ in range(LAYERS)
    ]
    head = w(VOCAB, HIDDEN)
    x, x_mlp = torch.randn(rows, HIDDEN, dtype=dtype), torch.randn(rows, MLP, dtype=dtype)

    def one_pass() -> None:
        for qkv, o, gate_up, down in layers:
            cpu_gemm.linear(x, qkv, None)
            cpu_gemm.linear(x, o, None)
            if cpu_gemm.silu_mul_linear(x, gate_up) is None:
                cpu_gemm.linear(x, gate_up, None)
            cpu_gemm.linear(x_mlp, down, None)
        cpu_gemm.linear(x, head, None)

    for _ in range(3):
        one_pass()
    best = float("inf")
    for _ in range(10):
        t = time.perf_counter()
        one_pass()
        best = min(best, time.perf_counter() - t)
    weights = sum(t.numel() * t.element_size() for layer in layers for t in layer)
    weights += head.numel() * head.element_size()
    stream = memory_bandwidth(threads)
    return {
        "rows": rows,
        "weight_bytes": weights,
        "pass_s": best,
        "gemm_gb_s": weights / best / 1e9,
        "stream_gb_s": stream / 1e9,
        "floor_s": weights / stream,
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    args = p.parse_args(argv)
    if not cpu_gemm.enabled(torch.device("cpu"), getattr(torch, args.dtype)):
        raise SystemExit(
            "bench.engine.gemm_bandwidth: the engine's CPU kernels are not available here"
        )
    result = run(args.rows, args.threads, getattr(torch, args.dtype))
    print(
        f"{result['weight_bytes'] / 1e6:.0f} MB of weights at {args.rows} rows in "
        f"{result['pass_s'] * 1e3:.2f} ms: {result['gemm_gb_s']:.1f} GB/s against a streaming "
        f"read's {result['stream_gb_s']:.1f} (floor {result['floor_s'] * 1e3:.2f} ms)"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
