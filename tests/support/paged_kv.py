"""Paged KV caches for the kernel tests, on any device: random contexts in scattered blocks,
every other slot NaN, so a kernel that reads past a sequence or through a wrong block id
gives NaN. Shared by the interpreter tests (tests/engine) and the GPU suite (tests/gpu);
it sets nothing in the environment, so importing it never turns the Triton interpreter on."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedContexts:
    kv_layer: torch.Tensor  # [num_blocks, 2, page, Hk, D]
    block_ids: list[list[int]]  # per sequence, scattered over the pool
    seq_lens: list[int]


def make_paged_contexts(
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    page: int,
    dtype: torch.dtype,
    seed: int,
    device: torch.device | str = "cpu",
) -> PagedContexts:
    """Random K/V for each sequence in a cache whose other slots hold NaN. Drawn on the CPU
    (the same values whatever the device), then moved."""
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
        positions = torch.arange(n)
        # Two index tensors around a slice: the indexed result is [n, 2, Hk, D].
        kv[torch.tensor(blocks)[positions // page], :, positions % page] = values.transpose(0, 1)
    return PagedContexts(kv.to(device), block_ids, list(seq_lens))


def to_page_one(ctx: PagedContexts) -> PagedContexts:
    """The same contexts in a block-size-1 layout (block b, offset o -> block b*page + o)."""
    num_blocks, _, page, heads, dim = ctx.kv_layer.shape
    kv = ctx.kv_layer.transpose(1, 2).reshape(num_blocks * page, 2, 1, heads, dim).contiguous()
    block_ids = [
        [blocks[p // page] * page + p % page for p in range(n)]
        for blocks, n in zip(ctx.block_ids, ctx.seq_lens, strict=True)
    ]
    return PagedContexts(kv, block_ids, ctx.seq_lens)


def padded_table(block_ids: list[list[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    width = max(len(b) for b in block_ids)
    rows = [b + [0] * (width - len(b)) for b in block_ids]
    return torch.tensor(rows, dtype=torch.int32, device=device)


def poisoned(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)
