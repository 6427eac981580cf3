"""Choosing the prefill kernel's launch on a device: every candidate timed on prompts already
in the paged cache, each checked against SDPA first (a launch that is fast and wrong, or does
not compile, is reported and never chosen).

    candidates   gathered keys: keys per step x warps x pipeline stages; whole pages (tensor
                 descriptors, TMA on Hopper) where the head_dim allows: pages per step x
                 warps x stages, and tiles of 128 rows on 8 warps
    shapes       batch x prompt length, causal, 16-token pages in a shuffled block table
    table entry  the fastest launch, per (dtype, head_dim), its tile height with it: what
                 engine/kernels/tuned.py serves to `launch_config` (the engine's layouts and
                 step graphs cut tiles as it says)

`bench.engine.kernels --tune` runs it at head_dim 128 with every candidate at three tile
heights (for the record); the device check (bench/device/tuning.py) at head_dims 64, 128
and 256, and writes the device's table.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from bench.engine import launch_rows

HEADS = {64: (32, 8), 128: (32, 8), 256: (16, 8)}
"""Query and KV heads tuned at each head_dim (GQA as Llama's; Gemma's shape at 256)."""
PAGE = 16


def candidates(dtype: torch.dtype, head_dim: int) -> list[Any]:
    """Every launch to try: float32 tiles take twice the shared memory (fewer keys, fewer
    stages); head_dim 256 halves the keys a step. Gathered keys at head_dims up to 128 take
    4 warps only: 8 were 1.5-1.9x slower at every key step and stage count on an H100
    (bench/results/engine/kernels_tune_bf16_h100.json). Whole pages step one, two and four
    pages (16, 32 and 64 keys)."""
    from engine.kernels.prefill_attention import LaunchConfig

    if dtype == torch.float32:
        gather = itertools.product((16, 32), (4, 8), (1, 2))
    elif head_dim > 128:
        gather = itertools.product((16, 32), (4, 8), (2, 3))
    else:
        gather = itertools.product((32, 64), (4,), (2, 3))
    gathered = [LaunchConfig(*launch) for launch in gather]
    whole = []
    if head_dim in (64, 128, 256):
        steps = (PAGE, 2 * PAGE, 4 * PAGE)
        whole = [LaunchConfig(keys, warps, stages, whole_pages=True)
                 for keys, warps, stages in itertools.product(steps, (4, 8), (2, 3))]  # fmt: skip
        # Tiles of 128 rows over two warp groups (Hopper's attention kernels' shape).
        whole += [LaunchConfig(keys, 8, stages, whole_pages=True, block_m=128)
                  for keys, stages in itertools.product(steps, (2, 3))]  # fmt: skip
    # The first gathered launch (the H100's choice at head_dim 128), then whole pages: a
    # tuning cut short has the figures that decide between the two ways.
    return gathered[:1] + whole + gathered[1:]


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    length: int
    tables: list[list[int]]
    q: torch.Tensor
    kv: torch.Tensor
    want: torch.Tensor


def make_shapes(
    cases: Sequence[tuple[int, int]], hq: int, hk: int, d: int, dtype: torch.dtype,
    device: torch.device,
) -> list[Shape]:  # fmt: skip
    """Prompts of `length` tokens written to shuffled pages, and SDPA's answer for each."""
    shapes = []
    for batch, length in cases:
        nblk = length // PAGE
        kv = torch.randn(batch * nblk, 2, PAGE, hk, d, dtype=dtype, device=device)
        tables = torch.randperm(batch * nblk).view(batch, nblk).tolist()
        q = torch.randn(batch * length, hq, d, dtype=dtype, device=device)
        idx = torch.tensor(tables, device=device)
        k, v = (kv[idx, i].flatten(1, 2).transpose(1, 2) for i in (0, 1))
        qb = q.view(batch, length, hq, d).transpose(1, 2)
        want = F.scaled_dot_product_attention(qb, k, v, is_causal=True, scale=d**-0.5,
                                              enable_gqa=True)  # fmt: skip
        shapes.append(Shape(batch, length, tables, q, kv, want.transpose(1, 2).reshape(q.shape)))
    return shapes


def tune(
    dtype: torch.dtype,
    device: torch.device,
    head_dim: int,
    shapes: list[Shape],
    timer: Callable[[Callable[[], Any]], float],
    block_ms: Sequence[int] | None = None,
    launches: Sequence[Any] | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Each candidate's total ms over `shapes` (`timer` gives one call's ms), fastest first;
    None with the error where it fails to compile or disagrees with SDPA, or why it was not
    tried (`deadline`, a time.monotonic() past which none starts). `block_ms`: each
    candidate at each of these tile heights instead of its own."""
    from engine.kernels.prefill_attention import PrefillLayout

    configs = list(launches or candidates(dtype, head_dim))
    if block_ms:
        configs = [dataclasses.replace(c, block_m=m) for m in block_ms for c in configs]
    layouts: dict[int, list[Any]] = {}
    rows = []
    for config in configs:
        if config.block_m not in layouts:
            layouts[config.block_m] = [
                PrefillLayout.build([i * s.length for i in range(s.batch)], [s.length] * s.batch,
                                    [s.length] * s.batch, s.tables, device, config.block_m)
                for s in shapes
            ]  # fmt: skip
        row = dict(head_dim=head_dim, **dataclasses.asdict(config), ms=None)
        pairs = list(zip(layouts[config.block_m], shapes, strict=True))
        total = lambda c=config, p=pairs: sum(_time_checked(lay, c, s, timer) for lay, s in p)  # noqa: E731
        rows.append(launch_rows.measured(row, "ms", total, deadline))
    rows.sort(key=lambda r: float("inf") if r["ms"] is None else r["ms"])
    return rows


def table_entry(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest launch that ran, as LaunchConfig's fields."""
    from engine.kernels.prefill_attention import LaunchConfig

    return launch_rows.entry(rows, LaunchConfig, "ms")


def _time_checked(layout: Any, config: Any, shape: Shape, timer: Callable) -> float:
    from engine.kernels.prefill_attention import paged_prefill_attention

    out = torch.empty_like(shape.q)
    scale = shape.q.shape[-1] ** -0.5
    paged_prefill_attention(shape.q, shape.kv, layout, scale, out, config)
    want = shape.want.float()
    error = (out.float() - want).abs().amax() / want.abs().amax()
    if not error <= 2e-2:
        raise ValueError(f"error {float(error):.3g} of the largest output, against SDPA")
    return timer(lambda: paged_prefill_attention(shape.q, shape.kv, layout, scale, out, config))
