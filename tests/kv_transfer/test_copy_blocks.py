"""The shm backend's native block copy (engine/cpu_kernels/copy_blocks.cpp) against torch
indexing on the same layout, and its refusals."""

from __future__ import annotations

import random

import pytest
import torch

from engine import cpu_kernels

native = cpu_kernels.load("copy_blocks")
pytestmark = pytest.mark.skipif(native is None, reason="no C++ toolchain for the kernel")

BLOCK = 12  # bytes per block: small and not a power of two


def caches(src_blocks: int, dst_blocks: int, layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(src_blocks * 100 + dst_blocks)
    src = torch.randint(0, 256, (layers, src_blocks, BLOCK), dtype=torch.uint8, generator=gen)
    return src, torch.zeros(layers, dst_blocks, BLOCK, dtype=torch.uint8)


def copy(dst: torch.Tensor, src: torch.Tensor, layers, src_ids, dst_ids) -> None:
    native.copy_blocks(
        dst.data_ptr(),
        dst.numel(),
        dst.shape[1] * BLOCK,
        src.data_ptr(),
        src.numel(),
        src.shape[1] * BLOCK,
        BLOCK,
        layers,
        src_ids,
        dst_ids,
    )


@pytest.mark.parametrize("seed", range(8))
def test_blocks_land_where_indexing_puts_them(seed: int) -> None:
    rng = random.Random(seed)
    src, dst = caches(20, 13, 4)
    n = rng.randint(1, 13)
    src_ids = sorted(rng.sample(range(20), n)) if seed % 2 else rng.sample(range(20), n)
    dst_ids = list(range(13 - n, 13)) if seed % 3 == 0 else rng.sample(range(13), n)
    layers = rng.sample(range(4), rng.randint(1, 4))
    expected = dst.clone()
    for layer in layers:
        expected[layer, dst_ids] = src[layer, src_ids]
    copy(dst, src, layers, src_ids, dst_ids)
    assert torch.equal(dst, expected)


def test_out_of_range_blocks_are_refused_before_any_copy() -> None:
    src, dst = caches(4, 4, 2)
    with pytest.raises(IndexError, match="outside the destination buffer"):
        copy(dst, src, [0, 1], [0, 1], [2, 4])
    with pytest.raises(IndexError, match="outside the source buffer"):
        copy(dst, src, [2], [0], [0])
    with pytest.raises(IndexError, match="outside the source buffer"):
        copy(dst, src, [0], [-1], [0])
    assert not dst.any()
    with pytest.raises(ValueError, match="2 source blocks but 1 destination"):
        copy(dst, src, [0], [0, 1], [0])
