"""Helpers shared by the kernel tests (paged caches with scattered blocks, tolerances), and
tests of the argument checks every host wrapper runs before it launches."""

from __future__ import annotations

import os

# Read when `@triton.jit` runs: set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import dataclass

import pytest
import torch

TOLERANCE = {
    torch.float32: dict(atol=2e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


@dataclass
class PagedContexts:
    kv_layer: torch.Tensor  # [num_blocks, 2, page, Hk, D]
    block_ids: list[list[int]]  # per sequence, scattered over the pool
    seq_lens: list[int]


def make_paged_contexts(
    seq_lens: list[int], num_kv_heads: int, head_dim: int, page: int, dtype: torch.dtype, seed: int
) -> PagedContexts:
    """Random K/V for each sequence in a cache whose every other slot holds NaN, so a kernel
    that reads past a sequence's length (or a wrong block) produces NaN."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // page) for n in seq_lens]
    num_blocks = sum(needed) + 3  # spare blocks stay NaN
    kv = torch.full((num_blocks, 2, page, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    block_ids = []
    for n, k in zip(seq_lens, needed, strict=True):
        blocks, order = order[:k], order[k:]
        block_ids.append(blocks)
        values = torch.randn(2, n, num_kv_heads, head_dim, generator=gen).to(dtype)
        for p in range(n):
            kv[blocks[p // page], :, p % page] = values[:, p]
    return PagedContexts(kv, block_ids, list(seq_lens))


def to_page_one(ctx: PagedContexts) -> PagedContexts:
    """The same contexts in a block-size-1 layout (block b, offset o -> block b*page + o)."""
    num_blocks, _, page, heads, dim = ctx.kv_layer.shape
    kv = ctx.kv_layer.transpose(1, 2).reshape(num_blocks * page, 2, 1, heads, dim).contiguous()
    block_ids = [
        [blocks[p // page] * page + p % page for p in range(n)]
        for blocks, n in zip(ctx.block_ids, ctx.seq_lens, strict=True)
    ]
    return PagedContexts(kv, block_ids, ctx.seq_lens)


def padded_table(block_ids: list[list[int]]) -> torch.Tensor:
    width = max(len(b) for b in block_ids)
    return torch.tensor([b + [0] * (width - len(b)) for b in block_ids], dtype=torch.int32)


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


def test_page_one_layout_holds_the_same_tokens() -> None:
    ctx = make_paged_contexts([5, 17], 2, 8, 16, torch.float32, seed=0)
    flat = to_page_one(ctx)
    for seq, n in enumerate(ctx.seq_lens):
        for p in range(n):
            a = ctx.kv_layer[ctx.block_ids[seq][p // 16], :, p % 16]
            b = flat.kv_layer[flat.block_ids[seq][p], :, 0]
            assert torch.equal(a, b)


def test_wrappers_reject_bad_arguments() -> None:
    from engine.kernels.decode_attention import paged_decode_attention
    from engine.kernels.reshape_and_cache import reshape_and_cache

    kv = torch.zeros(4, 2, 16, 2, 64)
    table = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="query heads not a multiple"):
        paged_decode_attention(torch.zeros(1, 3, 64), kv, table, lens, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode_attention(torch.zeros(1, 4, 32), kv, table, lens, 1.0)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode_attention(torch.zeros(1, 4, 64, dtype=torch.float16), kv, table, lens, 1.0)
    with pytest.raises(ValueError, match="last dimension"):
        paged_decode_attention(torch.zeros(1, 4, 128)[..., ::2], kv, table, lens, 1.0)
    with pytest.raises(ValueError, match="cache holds"):
        k = torch.zeros(1, 1, 64)
        reshape_and_cache(k, k, kv, lens, lens)
