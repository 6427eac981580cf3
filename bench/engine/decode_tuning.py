"""Choosing the decode kernel's launch on a device: every candidate timed on decode rows over
contexts already in the paged cache, each checked against the reference first (a launch that
is fast and wrong, or does not compile, is reported and never chosen).

    candidates   keys a loop step x warps x pipeline stages; Triton's default launch (the
                 engine's without a table) first
    shapes       batch x context, 16-token pages in a shuffled block table, the engine's
                 split count for the shape (engine/kernels/decode_attention.py)
    score        each shape's time over the fastest candidate's on it, averaged: a large
                 batch's microseconds do not drown a single row's
    table entry  the best score, per (dtype, head_dim): what engine/kernels/tuned.py serves
                 to `decode_launch`

The device check (bench/device/tuning.py) runs it at batch 64 x 2,048 and 1 x 4,096 (its
targets' decode shapes) and writes the device's table beside the prefill kernel's.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from bench.engine import launch_rows

PAGE = 16


def candidates(dtype: torch.dtype) -> list[Any]:
    """Every launch to try: the kernel's default first (a tuning cut short keeps it), then
    each with one of its keys a step, warps or stages changed, then the rest of the grid."""
    from engine.kernels.decode_attention import DecodeLaunch, decode_launch

    default = decode_launch(dtype, 128)
    steps = (16, 32) if dtype == torch.float32 else (16, 32, 64)
    near = [dataclasses.replace(default, block_n=n) for n in steps]
    near += [dataclasses.replace(default, num_warps=8)]
    near += [dataclasses.replace(default, num_stages=n) for n in (2, 4)]
    grid = [DecodeLaunch(*launch) for launch in itertools.product(steps, (4, 8), (2, 4))]
    out = [default]
    for launch in near + grid:
        if launch not in out:
            out.append(launch)
    return out


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    context: int
    q: torch.Tensor
    kv: torch.Tensor
    tables: torch.Tensor
    lens: torch.Tensor
    splits: int
    want: torch.Tensor


def make_shapes(
    cases: Sequence[tuple[int, int]], hq: int, hk: int, d: int, dtype: torch.dtype,
    device: torch.device,
) -> list[Shape]:  # fmt: skip
    """`batch` rows of `context` tokens each in shuffled pages, and the reference's answer."""
    from engine.kernels.decode_attention import default_num_splits, paged_decode_attention_ref

    shapes = []
    for batch, context in cases:
        nblk = context // PAGE
        kv = torch.randn(batch * nblk, 2, PAGE, hk, d, dtype=dtype, device=device)
        perm = torch.randperm(batch * nblk, device=device)
        tables = perm.view(batch, nblk).to(torch.int32)
        lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        q = torch.randn(batch, hq, d, dtype=dtype, device=device)
        want = paged_decode_attention_ref(q, kv, tables, lens, d**-0.5)
        splits = default_num_splits(batch, hk, context, device)
        shapes.append(Shape(batch, context, q, kv, tables, lens, splits, want))
    return shapes


def tune(
    shapes: list[Shape],
    timer: Callable[[Callable[[], Any]], float],
    launches: Sequence[Any],
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Each candidate's ms on each shape (`timer` gives one call's ms) and its score, best
    first; None with the error where it fails to compile or disagrees with the reference,
    or why it was not tried (`deadline`, a time.monotonic() past which none starts)."""
    rows = []
    for launch in launches:
        row: dict[str, Any] = {**dataclasses.asdict(launch), "ms": None, "score": None}
        each = functools.partial(_each_ms, launch, shapes, timer)
        rows.append(launch_rows.measured(row, "ms", each, deadline))
    ran = [r for r in rows if r["ms"] is not None]
    if ran:
        best = [min(r["ms"][i] for r in ran) for i in range(len(shapes))]
        for r in ran:
            r["score"] = statistics.fmean(ms / b for ms, b in zip(r["ms"], best, strict=True))
    rows.sort(key=lambda r: float("inf") if r["score"] is None else r["score"])
    return rows


def table_entry(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best-scoring launch that ran, as DecodeLaunch's fields."""
    from engine.kernels.decode_attention import DecodeLaunch

    return launch_rows.entry(rows, DecodeLaunch, "score")


def _each_ms(launch: Any, shapes: list[Shape], timer: Callable) -> list[float]:
    return [_time_checked(launch, shape, timer) for shape in shapes]


def _time_checked(launch: Any, shape: Shape, timer: Callable) -> float:
    from engine.kernels.decode_attention import paged_decode_attention

    out = torch.empty_like(shape.q)
    scale = shape.q.shape[-1] ** -0.5

    def call() -> None:
        paged_decode_attention(shape.q, shape.kv, shape.tables, shape.lens, scale,
                               shape.splits, out, launch=launch)  # fmt: skip

    call()
    want = shape.want.float()
    error = (out.float() - want).abs().amax() / want.abs().amax()
    if not error <= 2e-2:
        raise ValueError(f"error {float(error):.3g} of the largest output, against the reference")
    return timer(call)
