"""Paged prefill / extend attention (Triton, under the interpreter) against its reference."""

from __future__ import annotations

import dataclasses
import os

# Read when `@triton.jit` runs: set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from engine.kernels import tuned
from engine.kernels.decode_attention import DecodeLaunch, decode_launch
from engine.kernels.prefill_attention import (
    LaunchConfig,
    PrefillLayout,
    launch_config,
    launch_for,
    paged_prefill_attention,
    paged_prefill_attention_ref,
)
from engine.kv_cache.quant import quantize
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


def run(
    q: torch.Tensor, ctx: PagedContexts, query_lens: list[int], config: LaunchConfig | None = None
) -> torch.Tensor:
    out = poisoned(tuple(q.shape), q.dtype)
    layout = layout_for(ctx, query_lens)
    return paged_prefill_attention(q, ctx.kv_layer, layout, 0.1, out, config)


def whole_pages(page: int) -> LaunchConfig:
    return LaunchConfig(block_n=page, num_warps=4, num_stages=2, whole_pages=True)


@pytest.mark.parametrize(
    "hq,hk,dim,page,chunks,dtype,whole",
    # Whole pages read every case whose head_dim a descriptor's block can hold.
    [(*case, False) for case in CASES] + [(*c, True) for c in CASES if c[2] in (64, 128, 256)],
)
def test_matches_reference(hq, hk, dim, page, chunks, dtype, whole) -> None:
    query_lens = [q for q, _ in chunks]
    ctx = make_paged_contexts([s for _, s in chunks], hk, dim, page, dtype, seed=dim + hq)
    q = torch.randn(LEADING_ROWS + sum(query_lens), hq, dim).to(dtype)
    got = run(q, ctx, query_lens, whole_pages(page) if whole else None)
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


def test_whole_pages_rescale_when_later_keys_score_higher() -> None:
    """Scores that climb along the context by far more than 2^8 a page: the running sums
    are rescaled when a row's maximum outgrows the one they carry, and match the reference."""
    chunks = [(40, 90), (33, 33)]
    query_lens = [q for q, _ in chunks]
    ctx = make_paged_contexts([s for _, s in chunks], 1, 64, 16, torch.float32, seed=5)
    q = torch.randn(LEADING_ROWS + sum(query_lens), 2, 64).abs()
    climb = torch.linspace(0.1, 8.0, 16).view(1, 16, 1, 1)
    ctx.kv_layer[:, 0] = ctx.kv_layer[:, 0].abs() * climb  # later slots score higher (NaN stays)
    layout = layout_for(ctx, query_lens)
    want = paged_prefill_attention_ref(q, ctx.kv_layer, layout, 0.5)
    for keys in (16, 32, 64):  # one, two and four pages a step
        config = LaunchConfig(block_n=keys, num_warps=4, num_stages=2, whole_pages=True)
        got = paged_prefill_attention(q, ctx.kv_layer, layout, 0.5, config=config)
        torch.testing.assert_close(got[LEADING_ROWS:], want[LEADING_ROWS:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pages", [2, 4])
@pytest.mark.parametrize("page", [16, 32])
def test_several_pages_a_step_give_the_reference_answer(pages: int, page: int) -> None:
    """Whole pages read `pages` at a time up to each tile's diagonal, the pages left over
    one at a time: tiles whose cached prefix holds a multiple of the step, one page more,
    and none (a fresh prompt)."""
    chunks = [(40, 40 + 8 * page), (20, 20 + 9 * page), (70, 70)]
    query_lens = [q for q, _ in chunks]
    ctx = make_paged_contexts([s for _, s in chunks], 2, 64, page, torch.float32, seed=pages)
    q = torch.randn(LEADING_ROWS + sum(query_lens), 4, 64)
    config = LaunchConfig(block_n=pages * page, num_warps=4, num_stages=2, whole_pages=True)
    assert config.pages_per_step(page) == pages
    got = run(q, ctx, query_lens, config)
    want = paged_prefill_attention_ref(q, ctx.kv_layer, layout_for(ctx, query_lens), 0.1)
    torch.testing.assert_close(got, want, equal_nan=True, **TOLERANCE[torch.float32])


def test_keys_a_step_become_whole_pages_the_cache_holds() -> None:
    launch = LaunchConfig(block_n=64, num_warps=4, num_stages=2, whole_pages=True)
    assert [launch.pages_per_step(page) for page in (8, 16, 32, 64, 128)] == [4, 4, 2, 1, 1]


def test_a_cache_whole_pages_cannot_read_runs_the_default_launch_and_its_tiles(
    monkeypatch,
) -> None:
    """A device's table names whole pages in tall tiles; a step on a layer they cannot read
    (a quantized cache, pages under 16 or over 64 tokens) runs the default gather, and its
    layout (the eager steps', the step graphs') is cut for that launch, not the table's."""
    monkeypatch.setattr(tuned, "device_name", lambda kind, _: "tuned cpu")
    monkeypatch.setattr(tuned, "_in_process", {})
    tall = dict(block_n=64, num_warps=8, num_stages=2, whole_pages=True, block_m=128)
    tuned.use("tuned cpu", {"prefill": {"float32/64": tall}})
    cpu = torch.device("cpu")
    readable = make_paged_contexts([20], 1, 64, 16, torch.float32, seed=1).kv_layer
    assert launch_for(readable, torch.float32, 64, cpu) == LaunchConfig(**tall)
    for page in (8, 128):
        layer = make_paged_contexts([20], 1, 64, page, torch.float32, seed=1).kv_layer
        assert launch_for(layer, torch.float32, 64, cpu) == launch_config(torch.float32, 64)
    quantized = quantize(readable, torch.int8)
    assert launch_for(quantized, torch.float32, 64, cpu).block_m == 64


def test_whole_pages_refuse_a_cache_they_cannot_read() -> None:
    ctx = make_paged_contexts([20], 1, 80, 16, torch.float32, seed=1)
    q = torch.randn(20, 2, 80)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        run(q, ctx, [20], whole_pages(16))


def test_a_device_with_a_tuned_table_launches_its_entries(monkeypatch) -> None:
    """The prefill kernel's entry and the decode kernel's (engine/kernels/tuned.py)."""
    entry = dict(block_n=16, num_warps=8, num_stages=3, whole_pages=True)
    decode = dict(block_n=64, num_warps=8, num_stages=4)
    monkeypatch.setattr(
        tuned, "device_name", lambda kind, _: "NVIDIA H200" if kind == "cuda" else None
    )
    monkeypatch.setattr(tuned, "_in_process", {})
    tuned.use("NVIDIA H200", {"prefill": {"bfloat16/128": entry},
                              "decode": {"bfloat16/128": decode}})  # fmt: skip
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert launch_config(torch.bfloat16, 128, cuda) == LaunchConfig(**entry)
    assert decode_launch(torch.bfloat16, 128, cuda) == DecodeLaunch(**decode)
    # What the table lacks, and a device without one, keep the default.
    assert launch_config(torch.bfloat16, 64, cuda) == launch_config(torch.bfloat16, 64)
    assert not launch_config(torch.bfloat16, 128, cpu).whole_pages
    assert decode_launch(torch.bfloat16, 64, cuda) == decode_launch(torch.bfloat16, 64)
    assert decode_launch(torch.bfloat16, 128, cpu).block_n == 32
    assert tuned.file_name("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3.json"


def test_a_tuned_choice_that_cannot_read_the_layer_falls_back_to_gathering(monkeypatch) -> None:
    """A table's whole-pages entry meets a head_dim no descriptor block holds: the launch
    gathers instead of failing the step."""
    monkeypatch.setattr(tuned, "device_name", lambda kind, _: "tuned cpu")
    monkeypatch.setattr(tuned, "_in_process", {})
    tuned.use("tuned cpu", {"prefill": {"float32/80": dataclasses.asdict(whole_pages(16))}})
    ctx = make_paged_contexts([20, 7], 1, 80, 16, torch.float32, seed=2)
    q = torch.randn(LEADING_ROWS + 27, 2, 80)
    got = run(q, ctx, [20, 7])
    want = paged_prefill_attention_ref(q, ctx.kv_layer, layout_for(ctx, [20, 7]), 0.1)
    torch.testing.assert_close(got, want, equal_nan=True, **TOLERANCE[torch.float32])
