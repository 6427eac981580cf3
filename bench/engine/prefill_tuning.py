"""Choosing the prefill kernel's launch on a device: every candidate timed on prompts already
in the paged cache, each checked against SDPA first (a launch that is fast and wrong, or does
not compile, is reported and never chosen).

    candidates   gathered keys: keys per step x warps x pipeline stages; whole pages (tensor
                 descriptors, TMA on Hopper) where the head_dim allows: pages per step x
                 warps x stages, and tiles of 128 rows on 8 warps
    shapes       batch x prompt length, causal, 16-token pages in a shuffled block table;
                 fresh prompts, or their last tokens over a cached prefix (chunked prefill)
    table entry  the fastest launch, per (dtype, head_dim), its tile height with it: what
                 engine/kernels/tuned.py serves to `launch_config` (the engine's layouts and
                 step graphs cut tiles as it says)

`bench.engine.kernels --tune` runs it at head_dim 128 with every candidate at three tile
heights (for the record); the device check (bench/device/tuning.py) at head_dims 64, 128
and 256, and writes the device's table.
"""

from __future__ import annotations

import dataclasses
import functools
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
        steps = (4 * PAGE, 2 * PAGE, PAGE)
        # Tiles of 128 rows over two warp groups (Hopper's attention kernels' shape).
        tall = [LaunchConfig(keys, 8, stages, whole_pages=True, block_m=128)
                for keys, stages in itertools.product(steps, (2, 3))]  # fmt: skip
        whole = [LaunchConfig(keys, warps, stages, whole_pages=True)
                 for keys, warps, stages in itertools.product(steps, (4, 8), (2, 3))]  # fmt: skip
        # Each kind's likeliest first: four pages a step in 64-row tiles on 4 warps, then in
        # 128-row tiles, then two pages and one.
        first = [whole[0], tall[0], whole[4], whole[8]]
        whole = first + [c for c in whole + tall if c not in first]
    # The first gathered launch (the H100's choice at head_dim 128), then whole pages: a
    # tuning cut short has the figures that decide between the two ways.
    return gathered[:1] + whole + gathered[1:]


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    length: int
    query: int
    """New tokens a prompt (its last `query` of `length`; the rest a cached prefix)."""
    tables: list[list[int]]
    q: torch.Tensor
    kv: torch.Tensor
    want: torch.Tensor

    def layout(self, device: torch.device, block_m: int) -> Any:
        from engine.kernels.prefill_attention import PrefillLayout

        return PrefillLayout.build([i * self.query for i in range(self.batch)],
                                   [self.query] * self.batch, [self.length] * self.batch,
                                   self.tables, device, block_m)  # fmt: skip


def make_shapes(
    cases: Sequence[tuple[int, ...]], hq: int, hk: int, d: int, dtype: torch.dtype,
    device: torch.device,
) -> list[Shape]:  # fmt: skip
    """Per case (batch, length[, query]): prompts of `length` tokens written to shuffled
    pages, their last `query` (all, by default) the new tokens over a cached prefix, and
    SDPA's answer for those."""
    shapes = []
    for batch, length, *rest in cases:
        query = rest[0] if rest else length
        nblk = length // PAGE
        kv = torch.randn(batch * nblk, 2, PAGE, hk, d, dtype=dtype, device=device)
        tables = torch.randperm(batch * nblk).view(batch, nblk).tolist()
        q = torch.randn(batch, length, hq, d, dtype=dtype, device=device)
        idx = torch.tensor(tables, device=device)
        k, v = (kv[idx, i].flatten(1, 2).transpose(1, 2) for i in (0, 1))
        want = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True,
                                              scale=d**-0.5, enable_gqa=True)  # fmt: skip
        # A row's answer depends on the keys up to its own: the last `query` rows of the whole
        # prompt's are the answer of those rows over the cached prefix.
        new = q[:, length - query :].reshape(batch * query, hq, d)
        want = want.transpose(1, 2)[:, length - query :].reshape(new.shape)
        shapes.append(Shape(batch, length, query, tables, new.contiguous(), kv, want))
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
    configs = list(launches or candidates(dtype, head_dim))
    if block_ms:
        configs = [dataclasses.replace(c, block_m=m) for m in block_ms for c in configs]
    layouts: dict[int, list[Any]] = {}
    rows = []
    for config in configs:
        if config.block_m not in layouts:
            layouts[config.block_m] = [s.layout(device, config.block_m) for s in shapes]
        row = dict(head_dim=head_dim, **dataclasses.asdict(config), ms=None)
        pairs = list(zip(layouts[config.block_m], shapes, strict=True))
        total = functools.partial(_total_ms, config, pairs, timer)
        rows.append(launch_rows.measured(row, "ms", total, deadline))
    rows.sort(key=lambda r: float("inf") if r["ms"] is None else r["ms"])
    return rows


def table_entry(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest launch that ran, as LaunchConfig's fields."""
    from engine.kernels.prefill_attention import LaunchConfig

    return launch_rows.entry(rows, LaunchConfig, "ms")


def _total_ms(config: Any, pairs: list[tuple[Any, Shape]], timer: Callable) -> float:
    return sum(_time_checked(layout, config, shape, timer) for layout, shape in pairs)


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
