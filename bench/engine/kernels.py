"""Kernel micro-benchmark (CUDA only): where the Triton kernels stand on a new GPU.

    python -m bench.engine.kernels [--dtype bfloat16] [--tune] \\
        [--out bench/results/engine/kernels_bf16_h100.json]

For each kernel, the median time (triton.testing.do_bench) next to a torch baseline and the
achieved memory bandwidth = bytes the kernel must move / time, against the device's peak:

    decode   paged_decode_attention  vs  SDPA on K/V already gathered contiguous (the gather
             itself is timed apart: it is what a non-paged kernel would have to pay), and
             flash-attn's paged flash_attn_with_kvcache (`flash_ms`); `graph_ms` is the
             kernel replayed from a CUDA graph, as a serving decode step runs it (the eager
             figure carries the Python launch, which a short kernel cannot hide)
             bytes = K + V of every context + q + out
    prefill  paged_prefill_attention vs  causal SDPA per prompt batch, and flash-attn's
             flash_attn_varlen_func on the packed prompts (`flash_ms`); also TFLOP/s
    cache    reshape_and_cache       vs  torch index_put     bytes = 2 x (K + V) of new tokens
    norm     rms_norm (fused add)    vs  torch reference     bytes = x, residual in, 2 out
    rotary   apply_rotary            vs  torch reference     bytes = q + k in and out

flash-attn is a baseline where it is installed and the dtype is half precision (it has no
float32 kernels); otherwise the run says why it is left out. Its paged KV cache needs pages
of a multiple of 256 tokens, so it reads the same contexts in 256-token pages where the
Triton kernel reads 16-token ones.

--tune times every candidate launch of the prefill kernel (query rows and keys per tile,
warps, pipeline stages, gathered keys or whole pages; bench/engine/prefill_tuning.py) on the
prefill shapes, checks each against SDPA, and prints the fastest: how
`engine/kernels/prefill_attention.launch_config`'s default was chosen.

The peak is the theoretical DRAM bandwidth when torch reports the memory clock and bus
width, else a measured device-to-device copy (marked "copy"). Without CUDA it prints a
skip message and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def peak_bandwidth(device: torch.device) -> tuple[float, str]:
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8, "spec"  # double data rate
    src = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _time(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3), "copy"


FLASH_PAGE = 256
"""flash-attn's paged cache takes pages of a multiple of 256 tokens."""


def load_flash_attn(dtype: torch.dtype) -> tuple[Any, str]:
    """flash-attn's module when it can be a baseline at `dtype` (else None), and a note."""
    if dtype == torch.float32:
        return None, "flash-attn left out: it has no float32 kernels"
    try:
        import flash_attn
    except (ImportError, OSError) as e:  # absent, or built against another torch / CUDA
        return None, f"flash-attn left out: not importable ({e})"
    return flash_attn, f"flash-attn {flash_attn.__version__} as a second baseline (flash_ms)"


def _time(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _row(name: str, ms: float, base_ms: float, nbytes: float, peak: float, **extra: Any) -> dict:
    gbps = nbytes / (ms * 1e-3) / 1e9
    row = dict(kernel=name, ms=ms, baseline_ms=base_ms, speedup=base_ms / ms, gb_s=gbps,
               pct_peak=100 * gbps * 1e9 / peak, **extra)  # fmt: skip
    extras = " ".join(
        f"{k}={v:.3f}" if k.endswith("_ms") else f"{k}={v:.1f}" if isinstance(v, float)
        else f"{k}={v}"
        for k, v in extra.items()
    )  # fmt: skip
    print(f"{name:<44} {ms:8.3f} ms  base {base_ms:8.3f} ms  {gbps:7.1f} GB/s "
          f"({row['pct_peak']:5.1f}% of peak) {extras}")  # fmt: skip
    return row


def bench_decode(dtype: torch.dtype, peak: float, dev: torch.device, flash: Any) -> list[dict]:
    cases = [(1, 4096), (8, 2048), (64, 1024), (256, 512), (32, 16384)]
    return [_decode_case(batch, ctx, dtype, peak, dev, flash) for batch, ctx in cases]


def _decode_case(
    batch: int, ctx: int, dtype: torch.dtype, peak: float, dev: torch.device, flash: Any
) -> dict:
    from engine.kernels.decode_attention import paged_decode_attention

    page, hq, hk, d = 16, 32, 8, 128
    nblk = ctx // page
    kv = torch.randn(batch * nblk + 1, 2, page, hk, d, dtype=dtype, device=dev)
    tables = torch.randperm(batch * nblk, device=dev).view(batch, nblk).int()
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, hq, d, dtype=dtype, device=dev)
    out = torch.empty_like(q)
    k = kv[tables.long(), 0].flatten(1, 2).transpose(1, 2).contiguous()  # [B, Hk, L, D]
    v = kv[tables.long(), 1].flatten(1, 2).transpose(1, 2).contiguous()
    ms = _time(lambda: paged_decode_attention(q, kv, tables, lens, d**-0.5, out=out))
    graph_ms = _graph_ms(lambda: paged_decode_attention(q, kv, tables, lens, d**-0.5, out=out))
    base = _time(
        lambda: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=d**-0.5, enable_gqa=True)
    )
    extra = {"graph_ms": graph_ms, "gather_ms": _time(lambda: kv[tables.long()])}
    if flash is not None:
        extra["flash_ms"] = _flash_decode_ms(flash, q, lens, hk, ctx)
    nbytes = 2 * k.numel() * k.element_size() + 2 * q.numel() * q.element_size()
    name = f"decode B={batch} ctx={ctx} {hq}/{hk}x{d}"
    return _row(name, ms, base, nbytes, peak, **extra)


def _graph_ms(fn: Callable[[], Any]) -> float:
    """`fn` captured once in a CUDA graph (after a warm-up that compiles it), the replay timed."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _time(graph.replay)


def _flash_decode_ms(flash: Any, q: torch.Tensor, lens: torch.Tensor, hk: int, ctx: int) -> float:
    """flash_attn_with_kvcache over a paged cache of FLASH_PAGE-token pages, scattered."""
    batch, _, d = q.shape
    pages = batch * ctx // FLASH_PAGE
    k_cache, v_cache = (
        torch.randn(pages, FLASH_PAGE, hk, d, dtype=q.dtype, device=q.device) for _ in range(2)
    )
    table = torch.randperm(pages, device=q.device).view(batch, -1).int()
    q4 = q.unsqueeze(1)  # [B, 1 new token, Hq, D]
    return _time(
        lambda: flash.flash_attn_with_kvcache(
            q4, k_cache, v_cache, cache_seqlens=lens, block_table=table, softmax_scale=d**-0.5
        )
    )


def bench_prefill(dtype: torch.dtype, peak: float, dev: torch.device, flash: Any) -> list[dict]:
    cases = [(1, 4096), (8, 1024), (32, 256)]
    return [_prefill_case(batch, length, dtype, peak, dev, flash) for batch, length in cases]


@dataclasses.dataclass(frozen=True)
class PagedPrompts:
    """`batch` prompts of `length` tokens with their K/V in 16-token pages scattered over a
    cache, and the same K/V gathered contiguous for SDPA."""

    q: torch.Tensor  # [B * len, Hq, D]
    kv: torch.Tensor  # [blocks, 2, 16, Hk, D]
    layout: Any  # engine.kernels.prefill_attention.PrefillLayout
    idx: torch.Tensor  # [B, blocks a prompt]: each prompt's pages
    k: torch.Tensor  # [B, Hk, len, D]
    v: torch.Tensor
    qb: torch.Tensor  # [B, Hq, len, D], a view of q

    def tiles(self, block_m: int) -> Any:
        """The layout again with tiles of `block_m` query rows (a launch of that height)."""
        from engine.kernels.prefill_attention import PrefillLayout

        batch, length = self.qb.shape[0], self.qb.shape[2]
        return PrefillLayout.build([i * length for i in range(batch)], [length] * batch,
                                   [length] * batch, self.idx.tolist(), self.q.device,
                                   block_m)  # fmt: skip


def paged_prompts(
    batch: int, length: int, hq: int, hk: int, d: int, dtype: torch.dtype, dev: torch.device
) -> PagedPrompts:
    from engine.kernels.prefill_attention import PrefillLayout

    page = 16
    nblk = length // page
    kv = torch.randn(batch * nblk, 2, page, hk, d, dtype=dtype, device=dev)
    tables = torch.randperm(batch * nblk).view(batch, nblk).tolist()
    starts = [i * length for i in range(batch)]
    layout = PrefillLayout.build(starts, [length] * batch, [length] * batch, tables, dev)
    q = torch.randn(batch * length, hq, d, dtype=dtype, device=dev)
    idx = torch.tensor(tables, device=dev)
    k = kv[idx, 0].flatten(1, 2).transpose(1, 2).contiguous()
    v = kv[idx, 1].flatten(1, 2).transpose(1, 2).contiguous()
    qb = q.view(batch, length, hq, d).transpose(1, 2)
    return PagedPrompts(q, kv, layout, idx, k, v, qb)


def _prefill_case(
    batch: int, length: int, dtype: torch.dtype, peak: float, dev: torch.device, flash: Any
) -> dict:
    from engine.kernels.prefill_attention import paged_prefill_attention

    hq, hk, d = 32, 8, 128
    p = paged_prompts(batch, length, hq, hk, d, dtype, dev)
    q, kv, layout, idx, k, v, qb = p.q, p.kv, p.layout, p.idx, p.k, p.v, p.qb
    out = torch.empty_like(q)
    ms = _time(lambda: paged_prefill_attention(q, kv, layout, d**-0.5, out=out))
    base = _time(
        lambda: F.scaled_dot_product_attention(
            qb, k, v, is_causal=True, scale=d**-0.5, enable_gqa=True
        )
    )
    extra = {}
    if flash is not None:
        # The prompts packed [B * len, H, D], as a varlen batch sees them.
        packed_k, packed_v = (kv[idx, i].flatten(0, 2) for i in (0, 1))
        cu_seqlens = torch.arange(batch + 1, dtype=torch.int32, device=dev) * length
        extra["flash_ms"] = _time(
            lambda: flash.flash_attn_varlen_func(
                q, packed_k, packed_v, cu_seqlens, cu_seqlens, length, length,
                softmax_scale=d**-0.5, causal=True,
            )
        )  # fmt: skip
    flops = 4 * batch * hq * d * length * length / 2
    nbytes = 2 * k.numel() * k.element_size() + 2 * q.numel() * q.element_size()
    name = f"prefill B={batch} len={length} {hq}/{hk}x{d}"
    return _row(name, ms, base, nbytes, peak, tflops=flops / (ms * 1e-3) / 1e12, **extra)


def tune_prefill(dtype: torch.dtype, dev: torch.device) -> list[dict]:
    """Every candidate launch of the prefill kernel (bench/engine/prefill_tuning.py) at
    head_dim 128 on bench_prefill's shapes and three tile heights, fastest first."""
    from bench.engine import prefill_tuning

    hq, hk = prefill_tuning.HEADS[128]
    shapes = prefill_tuning.make_shapes(((1, 4096), (8, 1024), (32, 256)), hq, hk, 128, dtype, dev)
    rows = prefill_tuning.tune(dtype, dev, 128, shapes, _time, block_ms=(32, 64, 128))
    for row in rows:
        print(row)
    return rows


def bench_small(dtype: torch.dtype, peak: float, dev: torch.device) -> list[dict]:
    from engine.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref
    from engine.kernels.rms_norm import rms_norm, rms_norm_ref
    from engine.kernels.rotary import apply_rotary, apply_rotary_ref
    from engine.layers.rotary import RotaryEmbedding

    rows = []
    tokens, hk, hq, d, hidden = 4096, 8, 32, 128, 4096
    kv = torch.zeros(tokens // 16 + 1, 2, 16, hk, d, dtype=dtype, device=dev)
    k = torch.randn(tokens, hk, d, dtype=dtype, device=dev)
    slots = torch.randperm(tokens, device=dev)
    blocks, offsets = (slots // 16).int(), (slots % 16).int()
    ms = _time(lambda: reshape_and_cache(k, k, kv, blocks, offsets))
    base = _time(lambda: reshape_and_cache_ref(k, k, kv, blocks, offsets))
    rows.append(_row(f"reshape_and_cache T={tokens} {hk}x{d}", ms, base,
                     4 * k.numel() * k.element_size(), peak))  # fmt: skip
    x, r = (torch.randn(tokens, hidden, dtype=dtype, device=dev) for _ in range(2))
    w = torch.randn(hidden, dtype=dtype, device=dev)
    ms = _time(lambda: rms_norm(x, w, 1e-6, r))
    base = _time(lambda: rms_norm_ref(x, w, 1e-6, r))
    rows.append(_row(f"rms_norm+residual T={tokens} H={hidden}", ms, base,
                     4 * x.numel() * x.element_size(), peak))  # fmt: skip
    rope = RotaryEmbedding(d, 8192, 500000.0, None, dtype).to(dev)
    q = torch.randn(tokens, hq, d, dtype=dtype, device=dev)
    pos = torch.arange(tokens, device=dev)
    ms = _time(lambda: apply_rotary(pos, q, k, rope.cos, rope.sin))
    base = _time(lambda: apply_rotary_ref(pos, q, k, rope.cos, rope.sin))
    rows.append(_row(f"rotary T={tokens} {hq}+{hk}x{d}", ms, base,
                     2 * (q.numel() + k.numel()) * q.element_size(), peak))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--tune", action="store_true",
                        help="time the prefill kernel's candidate launches instead")  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.engine.kernels skipped: no CUDA device (the kernels run on CPU only in the "
              "Triton interpreter, which says nothing about speed)")  # fmt: skip
        return 0
    dev = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    peak, source = peak_bandwidth(dev)
    name = torch.cuda.get_device_name(dev)
    flash, flash_note = load_flash_attn(dtype)
    print(f"{name}: peak {peak / 1e9:.0f} GB/s ({source}), dtype {args.dtype}; {flash_note}")
    if args.tune:
        tuned = tune_prefill(dtype, dev)
        print("fastest:", *tuned[:5], sep="\n  ")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(
                json.dumps(dict(device=name, dtype=args.dtype, rows=tuned), indent=2)
            )
        return 0
    rows = bench_decode(dtype, peak, dev, flash) + bench_prefill(dtype, peak, dev, flash)
    rows += bench_small(dtype, peak, dev)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = dict(device=name, peak_gb_s=peak / 1e9, peak_source=source,
                      dtype=args.dtype, flash_attn=flash_note, rows=rows)  # fmt: skip
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
