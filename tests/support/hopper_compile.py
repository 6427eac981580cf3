"""Every Triton kernel compiled for a Hopper GPU (sm_90) on a machine without one: through the
host wrappers the engine calls, on CPU tensors, with Triton's real compiler (its PTX and
ptxas, not the interpreter) told its target is an H100; nothing launches. What the CPU suite
cannot otherwise see before a device run: a kernel that does not compile for the GPU (a
tensor descriptor, a dtype the interpreter accepts and the compiler does not).

    python -m tests.support.hopper_compile [I/N]   # of every N-th case from the I-th
        prints JSON: {"compiled": {kernel: [case, ...]}, "errors": [...], "kernels": [...]}

Runs in a process of its own: TRITON_INTERPRET must be 0 before triton.language is imported.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"

import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction

HOPPER = GPUTarget("cuda", 90, 32)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class _Hopper:
    """The driver Triton asks for its device, stream and target: an H100's target."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return HOPPER


def compile_all(shard: int = 0, shards: int = 1) -> dict[str, Any]:
    """Each kernel's compiled variants (by the case that asked for it), and every error; of
    every `shards`-th case from the `shard`-th (a process each compiles in parallel)."""
    driver.set_active(_Hopper())
    compiled: dict[str, list[str]] = {}
    errors: list[str] = []
    case = ["?"]
    run = JITFunction.run

    def compile_only(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.setdefault(self.fn.__name__, []).append(case[0])
        return kernel

    JITFunction.run = compile_only
    try:
        for name, call in _cases()[shard::shards]:
            case[0] = name
            try:
                call()
            except Exception as e:  # each failure is reported, the rest still compiled
                errors.append(f"{name}: {type(e).__name__}: {str(e)[:2000]}")
    finally:
        JITFunction.run = run
    return {"compiled": compiled, "errors": errors}


def kernel_names() -> list[str]:
    """Every launched kernel (a `@triton.jit` function named `*_kernel`) in engine.kernels."""
    import importlib
    import pkgutil

    import engine.kernels as package

    names = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"engine.kernels.{info.name}")
        for attr, value in vars(module).items():
            if isinstance(value, JITFunction) and attr.endswith("_kernel"):
                names.add(value.fn.__name__)
    return sorted(names)


def _cases() -> list[tuple[str, Callable[[], Any]]]:
    from engine.kernels.decode_attention import DecodeLaunch, paged_decode_attention
    from engine.kernels.int8_linear import int8_linear
    from engine.kernels.lora import lora_add
    from engine.kernels.nucleus import nucleus_threshold
    from engine.kernels.prefill_attention import (
        LaunchConfig,
        PrefillLayout,
        paged_prefill_attention,
    )
    from engine.kernels.reshape_and_cache import reshape_and_cache
    from engine.kernels.rms_norm import rms_norm
    from engine.kernels.rotary import apply_rotary
    from engine.kernels.rotary_cache import rotary_and_cache
    from engine.kernels.silu_and_mul import silu_and_mul
    from engine.kv_cache import quant as kv_quant
    from engine.layers.quant import quantize_weight
    from engine.layers.rotary import RotaryEmbedding
    from tests.support.paged_kv import make_paged_contexts

    cases: list[tuple[str, Callable[[], Any]]] = []

    def case(name: str, fn: Callable[..., Any], *args: Any) -> None:
        cases.append((name, partial(fn, *args)))

    page = 16
    slots = torch.tensor([0, 1, -1, 2, 3]), torch.tensor([0, 3, 0, 15, 7])  # block, offset

    def contexts(
        dim: int, dtype: torch.dtype, rows: int = 64
    ) -> tuple[Any, torch.Tensor, torch.Tensor, Any]:
        """Two sequences' paged KV, their block table, lengths and a prefill layout (tiles of
        `rows` query rows)."""
        ctx = make_paged_contexts([40, 17], 2, dim, page, dtype, seed=dim)
        table = torch.tensor([ctx.block_ids[0][:3], ctx.block_ids[1][:2] + [0]]).int()
        lens = torch.tensor(ctx.seq_lens, dtype=torch.int32)
        layout = PrefillLayout.build([0, 24], [24, 9], ctx.seq_lens, ctx.block_ids, "cpu", rows)
        return ctx, table, lens, layout

    for dtype in DTYPES:
        tag = str(dtype).removeprefix("torch.")
        for dim in (64, 128, 256):
            ctx, table, lens, layout = contexts(dim, dtype)
            tall = contexts(dim, dtype, 128)[3]
            q, qp = torch.randn(2, 8, dim).to(dtype), torch.randn(33, 8, dim).to(dtype)
            for splits in (1, 4):
                name = f"decode {tag} d{dim} splits{splits}"
                case(name, paged_decode_attention, q, ctx.kv_layer, table, lens, 0.1, splits)
            if dtype == torch.bfloat16:  # the tuning's widest launches
                for launch in (DecodeLaunch(64, 8, 4), DecodeLaunch(16, 4, 2)):
                    case(f"decode {tag} d{dim} {launch}", paged_decode_attention, q, ctx.kv_layer,
                         table, lens, 0.1, 4, None, None, None, launch)  # fmt: skip
            configs = [LaunchConfig(page, 4, 2), LaunchConfig(page, 4, 2, whole_pages=True)]
            if dtype == torch.bfloat16:  # several pages a step; tiles of 128 rows, 8 warps
                configs += [
                    LaunchConfig(2 * page, 4, 2, whole_pages=True),
                    LaunchConfig(4 * page, 8, 2, whole_pages=True, block_m=128),
                ]
            for config in configs:
                name = (f"prefill {tag} d{dim} whole_pages={config.whole_pages} "
                        f"keys{config.block_n} rows{config.block_m}")  # fmt: skip
                tiles = layout if config.block_m == layout.block_m else tall
                case(name, paged_prefill_attention, qp, ctx.kv_layer, tiles, 0.1, None, config)
        k, kv = torch.randn(5, 2, 64).to(dtype), torch.zeros(4, 2, page, 2, 64, dtype=dtype)
        case(f"reshape_and_cache {tag}", reshape_and_cache, k, k, kv, *slots)
        x, w = torch.randn(3, 512).to(dtype), torch.randn(512).to(dtype)
        case(f"rms_norm {tag}", rms_norm, x, w, 1e-5, None)
        case(f"rms_norm fused {tag}", rms_norm, x, w, 1e-5, x.clone())
        rope = RotaryEmbedding(64, 4096, 10000.0, None, dtype)
        q, k = torch.randn(5, 4, 64).to(dtype), torch.randn(5, 2, 64).to(dtype)
        for neox in (True, False):
            case(f"rotary {tag} neox={neox}", apply_rotary, torch.arange(5), q, k, rope.cos,
                 rope.sin, neox)  # fmt: skip
        for dim in (64, 128):
            rope = RotaryEmbedding(dim, 4096, 10000.0, None, dtype)
            q, k = torch.randn(5, 8, dim).to(dtype), torch.randn(5, 2, dim).to(dtype)
            kv = torch.zeros(4, 2, page, 2, dim, dtype=dtype)
            case(f"rotary_and_cache {tag} d{dim}", rotary_and_cache, torch.arange(5), q, k, k,
                 rope.cos, rope.sin, kv, *slots)  # fmt: skip
        case(f"silu_and_mul {tag}", silu_and_mul, torch.randn(3, 2 * 300).to(dtype))
        wq, scale = quantize_weight(torch.randn(256, 128))
        case(f"int8_linear {tag}", int8_linear, torch.randn(7, 128).to(dtype), wq, scale, None)
        x, a = torch.randn(6, 128).to(dtype), torch.randn(3, 128, 16).to(dtype)
        b, y = torch.randn(3, 16, 256).to(dtype), torch.randn(6, 256).to(dtype)
        lora_slots = torch.tensor([0, 2, -1, 1, 0, 2], dtype=torch.int32)
        case(f"lora {tag}", lora_add, y, x, a, b, lora_slots)
        p = torch.full((3,), 0.9)
        case(f"nucleus {tag}", nucleus_threshold, torch.randn(3, 5000).to(dtype), p)
    for cache in (torch.int8, torch.float8_e4m3fn):
        tag = str(cache).removeprefix("torch.")
        ctx, table, lens, layout = contexts(128, torch.float32)
        kv = kv_quant.quantize(ctx.kv_layer, cache)
        q, qp = torch.randn(2, 8, 128).bfloat16(), torch.randn(33, 8, 128).bfloat16()
        case(f"decode {tag} cache", paged_decode_attention, q, kv, table, lens, 0.1, 2)
        case(f"prefill {tag} cache", paged_prefill_attention, qp, kv, layout, 0.1)
        k = torch.randn(5, 2, 128).bfloat16()
        case(f"reshape_and_cache {tag} cache", reshape_and_cache, k, k, kv, *slots)
        rope = RotaryEmbedding(128, 4096, 10000.0, None, torch.bfloat16)
        q = torch.randn(5, 8, 128).bfloat16()
        case(f"rotary_and_cache {tag} cache", rotary_and_cache, torch.arange(5), q, k, k,
             rope.cos, rope.sin, kv, *slots)  # fmt: skip
    return cases


if __name__ == "__main__":
    shard, shards = (int(n) for n in sys.argv[1].split("/")) if len(sys.argv) > 1 else (0, 1)
    result = compile_all(shard, shards)
    result["kernels"] = kernel_names()
    json.dump(result, sys.stdout)
