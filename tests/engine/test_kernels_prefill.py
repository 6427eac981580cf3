"""Paged prefill / extend attention (Triton, under the interpreter) against its reference."""

from __future__ import annotations

import dataclasses
import os

# Read when `@triton.jit` runs: set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from engine.kernels.prefill_attention import (
    LaunchConfig,
    PrefillLayout,
    paged_prefill_attention,
    paged_prefill_attention_ref,
)
from tests.engine.test_kernels_common import TOLERANCE
from tests.support.paged_kv import PagedContexts, make_paged_contexts, poisoned, to_page_one

# (query heads, kv heads, head_dim, page, [(query_len, seq_len) per chunk], dtype):
# fresh prompts (query_len == seq_len), extends over a cached prefix, a single-token chunk,
# lengths on and around block boundaries, a chunk longer than one query tile (32 rows).
CASES = [
    (4, 2, 64, 16, [(16, 16), (1, 17), (5, 40)], torch.float32),
    (4, 4, 80, 32, [(33, 33), (7, 32)], torch.float32),
    (8, 1, 96, 16, [(3, 3), (17, 50)], torch.float16),
    (2, 2, 128, 16, [(40, 47)], torch.bfloat16),
    (4, 1, 256, 32, [(2, 65), (9, 9)], torch.float32),
]
LEADING_ROWS = 2  # rows before the chunks (the step's decode tokens): never touched


def layout_for(ctx: PagedContexts, query_lens: list[int]) -> PrefillLayout:
    starts = [LEADING_ROWS + sum(query_lens[:i]) for i in range(len(query_lens))]
    return PrefillLayout.build(
        starts, query_lens, ctx.seq_lens, ctx.block_ids, torch.device("cpu"), block_m=32
    )


def run(q: torch.Tensor, ctx: PagedContexts, query_lens: list[int]) -> torch.Tensor:
    out = poisoned(tuple(q.shape), q.dtype)
    return paged_prefill_attention(q, ctx.kv_layer, layout_for(ctx, query_lens), 0.1, out=out)


@pytest.mark.parametrize("hq,hk,dim,page,chunks,dtype", CASES)
def test_matches_reference(hq, hk, dim, page, chunks, dtype) -> None:
    query_lens = [q for q, _ in chunks]
    ctx = make_paged_contexts([s for _, s in chunks], hk, dim, page, dtype, seed=dim + hq)
    q = torch.randn(LEADING_ROWS + sum(query_lens), hq, dim).to(dtype)
    got = run(q, ctx, query_lens)
    want = paged_prefill_attention_ref(q, ctx.kv_layer, layout_for(ctx, query_lens), 0.1)
    assert got[:LEADING_ROWS].isnan().all(), "rows outside the chunks were written"
    assert not got[LEADING_ROWS:].isnan().any(), "a chunk row was left unwritten"
    torch.testing.assert_close(got, want, equal_nan=True, **TOLERANCE[dtype])


def test_block_size_16_gives_the_block_size_1_answer() -> None:
    chunks = [(4, 20), (16, 16), (1, 33)]
    query_lens = [q for q, _ in chunks]
    ctx = make_paged_contexts([s for _, s in chunks], 1, 64, 16, torch.float32, seed=3)
    q = torch.randn(LEADING_ROWS + sum(query_lens), 2, 64)
    paged = run(q, ctx, query_lens)
    flat = run(q, to_page_one(ctx), query_lens)
    torch.testing.assert_close(paged, flat, equal_nan=True, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (64, 16), (128, 64)])
def test_any_tile_shape_gives_the_reference_answer(block_m: int, block_n: int) -> None:
    """The tile shapes `bench.engine.kernels --tune` tries: query tiles cut across the causal
    diagonal and the cached prefix at other places, keys taken in other steps."""
    chunks = [(70, 100), (1, 9), (130, 130)]
    query_lens = [q for q, _ in chunks]
    ctx = make_paged_contexts([s for _, s in chunks], 2, 64, 16, torch.float32, seed=block_m)
    q = torch.randn(LEADING_ROWS + sum(query_lens), 4, 64)
    starts = [LEADING_ROWS + sum(query_lens[:i]) for i in range(len(query_lens))]
    layout = PrefillLayout.build(starts, query_lens, ctx.seq_lens, ctx.block_ids, "cpu", block_m)
    assert layout.tile_chunks.shape[0] == sum(-(-n // block_m) for n in query_lens)
    out = poisoned(tuple(q.shape), q.dtype)
    config = LaunchConfig(block_n=block_n, num_warps=4, num_stages=2)
    got = paged_prefill_attention(q, ctx.kv_layer, layout, 0.1, out, config)
    want = paged_prefill_attention_ref(q, ctx.kv_layer, layout, 0.1)
    torch.testing.assert_close(got, want, equal_nan=True, **TOLERANCE[torch.float32])


def test_layout_rejects_a_chunk_longer_than_its_context() -> None:
    with pytest.raises(ValueError, match="query_len"):
        PrefillLayout.build([0], [5], [4], [[0]], torch.device("cpu"))


def test_padding_tiles_of_a_fixed_grid_write_nothing() -> None:
    """A captured step (engine/step_graphs.py) launches more tiles than its chunks fill: the
    extra tiles name a chunk of no queries and leave every row as it was."""
    chunks = [(5, 21), (16, 16)]
    query_lens = [q for q, _ in chunks]
    ctx = make_paged_contexts([s for _, s in chunks], 2, 64, 16, torch.float32, seed=9)
    q = torch.randn(LEADING_ROWS + sum(query_lens), 4, 64)
    exact = layout_for(ctx, query_lens)
    int32 = dict(dtype=torch.int32)
    padded = dataclasses.replace(
        exact,
        # A third chunk, of no queries, at the end of every per-chunk array.
        query_starts=torch.cat([exact.query_starts, torch.zeros(1, **int32)]),
        query_lens=torch.cat([exact.query_lens, torch.zeros(1, **int32)]),
        seq_lens=torch.cat([exact.seq_lens, torch.zeros(1, **int32)]),
        block_tables=torch.cat([exact.block_tables, exact.block_tables[:1]]),
        tile_chunks=torch.cat([exact.tile_chunks, torch.full((3,), 2, **int32)]),
        tile_rows=torch.cat([exact.tile_rows, torch.zeros(3, **int32)]),
    )
    got = paged_prefill_attention(q, ctx.kv_layer, padded, 0.1, out=poisoned(q.shape, q.dtype))
    want = paged_prefill_attention_ref(q, ctx.kv_layer, exact, 0.1)
    assert got[:LEADING_ROWS].isnan().all(), "a padding tile wrote a row"
    torch.testing.assert_close(got, want, equal_nan=True, **TOLERANCE[torch.float32])
