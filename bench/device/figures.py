"""What the device check measures in its own process: the hardware's rates, the prefill
kernel against SDPA and the checkpoint (the engine's steps and offline runs, each beside its
floor: bench/device/engine_steps.py; bench/device/check.py runs them in order), and the
report's table.

Floors, from the rates measured in the same run:
    decode step       (weight bytes + the KV bytes the step reads) / copy GB/s
    prefill step      model FLOPs (2 x parameters x tokens, plus causal attention's
                      4 x layers x heads x head_dim x tokens^2 / 2) / bf16 matmul FLOP/s
"""

from __future__ import annotations

import dataclasses
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

LLAMA_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=14336,
    max_position_embeddings=8192,
)
"""Llama-3.1-8B's shape (its context cut to 8,192 positions: the check's longest is 2,112)."""

TINY = dict(vocab_size=1024, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=4096)  # fmt: skip


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeat: int = 5) -> float:
    """Median seconds of a call. On CUDA Triton's `do_bench` (device time between events, the
    L2 flushed between calls, as bench/engine/kernels.py times kernels: a short kernel's
    host-side checks and launch do not count); elsewhere `repeat` calls after a warm-up,
    each between two host clocks."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) / 1e3
    fn()
    times = []
    for _ in range(repeat):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def hardware_rates(device: torch.device, small: bool) -> dict[str, Any]:
    """A device-to-device copy's bytes moved (read + written) a second, and a bf16 square
    matmul's FLOP/s (float32 on the CPU dry run)."""
    n = (1 << 24) if small else (1 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src), device, repeat=10)
    size = 256 if small else 8192
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    mm_s = timed(lambda: a @ b, device, repeat=10)
    return {
        "copy_gb_s": 2 * n / copy_s / 1e9,
        "copy_bytes": n,
        "matmul_tflop_s": 2 * size**3 / mm_s / 1e12,
        "matmul_shape": [size, size, size],
        "matmul_dtype": str(dtype).removeprefix("torch."),
    }


def prefill_attention_against_sdpa(device: torch.device, small: bool) -> dict[str, Any]:
    """The Triton prefill kernel on 16-token pages against each SDPA backend on the same
    prompts gathered contiguous (32 query / 8 KV heads of 128; the dry run: 4 / 2 of 64)."""
    cases = [(1, 64), (2, 32)] if small else [(1, 4096), (8, 1024)]
    hq, hk, d = (4, 2, 64) if small else (32, 8, 128)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    rows = [_prefill_case(batch, length, hq, hk, d, dtype, device) for batch, length in cases]
    headline = {
        f"{r['batch']}x{r['length']} fastest_sdpa/triton": r.get("triton_vs_fastest_sdpa")
        for r in rows
    }
    return {"rows": rows, "headline": headline}


def _prefill_case(
    batch: int, length: int, hq: int, hk: int, d: int, dtype: torch.dtype, device: torch.device
) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.engine.kernels import paged_prompts
    from engine.kernels.prefill_attention import launch_config, paged_prefill_attention

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}  # fmt: skip
    p = paged_prompts(batch, length, hq, hk, d, dtype, device)
    q, kv, layout, k, v, qb = p.q, p.kv, p.layout, p.k, p.v, p.qb
    out = torch.empty_like(q)
    scale = d**-0.5
    row: dict[str, Any] = {"batch": batch, "length": length, "heads": [hq, hk, d]}
    launch, default = launch_config(dtype, d, device), launch_config(dtype, d)
    row["launch"] = dataclasses.asdict(launch)  # the device's tuned one where it has one
    # Each launch on tiles of its own height, as the engine lays a step out for it.
    tiled = layout if launch.block_m == layout.block_m else p.tiles(launch.block_m)
    row["triton_ms"] = 1e3 * timed(
        lambda: paged_prefill_attention(q, kv, tiled, scale, out, launch), device
    )
    want = F.scaled_dot_product_attention(qb, k, v, is_causal=True, scale=scale,
                                          enable_gqa=True)  # fmt: skip
    got = out.view(batch, length, hq, d).transpose(1, 2)
    row["max_abs_err"] = float((got.float() - want.float()).abs().max())  # the launch's
    if launch != default:
        default_tiles = layout if default.block_m == layout.block_m else p.tiles(default.block_m)
        row["triton_default_launch_ms"] = 1e3 * timed(
            lambda: paged_prefill_attention(q, kv, default_tiles, scale, out, default), device
        )
    # Each backend on the GQA call, else on K/V repeated to every query head (a backend that
    # takes no GQA, as cuDNN's may not): its time is the faster that runs.
    group = hq // hk
    expanded = (k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))
    for name, backend in backends.items():
        if name == "math" and device.type == "cuda":
            continue  # the slowest; the others are the peers
        times, why = [], []
        for keys, values, gqa in ((k, v, True), (*expanded, False)):

            def sdpa(backend=backend, keys=keys, values=values, gqa=gqa) -> torch.Tensor:
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(
                        qb, keys, values, is_causal=True, scale=scale, enable_gqa=gqa
                    )

            try:
                times.append(timed(sdpa, device))
            except RuntimeError as e:  # this backend does not take these shapes or dtype
                why.append(str(e).splitlines()[0][:200])
        row[f"sdpa_{name}_ms"] = 1e3 * min(times) if times else None
        if not times:
            row[f"sdpa_{name}_why"] = why[0]
    sdpa_ms = [v for key, v in row.items() if key.startswith("sdpa_") and key.endswith("_ms") and v]
    row["fastest_sdpa_ms"] = min(sdpa_ms) if sdpa_ms else None
    if row["fastest_sdpa_ms"]:
        row["triton_vs_fastest_sdpa"] = row["fastest_sdpa_ms"] / row["triton_ms"]
    row["tflop_s"] = 4 * batch * hq * d * length * length / 2 / (row["triton_ms"] * 1e-3) / 1e12
    return row


def make_checkpoint(folder: Path, device: torch.device, small: bool) -> dict[str, Any]:
    """The 8B-shaped checkpoint (the dry run: the tiny preset), bf16, weights drawn on the
    device and written in 4 shards; one already in `folder` with that shape is reused."""
    from engine.tiny_model import make_tiny_model

    shape = TINY if small else LLAMA_8B
    start = time.monotonic()
    config = folder / "config.json"
    if _complete(folder) and all(
        json.loads(config.read_text()).get(k) == v for k, v in shape.items()
    ):
        # A warm machine's second call: the same checkpoint, already written.
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        return {"path": str(folder), "shape": shape, "bytes": size, "made_s": 0.0, "reused": True}
    path = make_tiny_model(folder, arch="llama", dtype="bfloat16", device=str(device),
                           shards=1 if small else 4, force=True, **shape)  # fmt: skip
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    size = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    return {"path": str(path), "shape": shape, "bytes": size, "made_s": time.monotonic() - start}


def _complete(folder: Path) -> bool:
    """A checkpoint whose every shard was written (config.json is written first)."""
    from engine.checkpoint import CheckpointError, list_weight_files

    try:
        return (folder / "config.json").exists() and bool(list_weight_files(folder))
    except CheckpointError:  # a shard missing or cut short
        return False


def table(report: dict[str, Any]) -> str:
    """The report's headline figures, one per line."""
    lines = [f"device check on {report['host'].get('device')} ({report.get('total_s')} s)"]
    for name, section in report["sections"].items():
        if "error" in section:
            lines.append(f"  {name:<11} ERROR {section['error'][:150]}")
        elif "skipped" in section:
            lines.append(f"  {name:<11} skipped: {section['skipped']}")
        else:
            headline = section.get("headline") or {
                k: v
                for k, v in section.items()
                if isinstance(v, int | float | str) and k != "took_s"
            }
            shown = ", ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in headline.items()
            )
            lines.append(f"  {name:<11} {shown[:400]}")
    for target in report.get("targets", []):
        held = {True: "held", False: "MISSED", None: "no figure"}[target["held"]]
        figure = "-" if target["figure"] is None else f"{target['figure']:.3g}"
        bound = ("<= " if target["at_most"] else ">= ") + f"{target['bound']:g}"
        lines.append(f"  target {held:<9} {figure:>8} {bound:<7} {target['what']}")
    return "\n".join(lines)
