"""engine/kv_cache/remap.py: a prompt's KV written by prefill ranks of one layout lands in a
decode rank of another exactly as that rank's own engine would have written it: blocks
re-cut, heads joined or cut out, values converted or quantized; blocks it already caches
stay as they are."""

from __future__ import annotations

import random

import pytest
import torch

from core.kv_layout import kv_head_range
from engine.kv_cache import quant
from engine.kv_cache.remap import Source, land

LAYERS, HEADS, HEAD_DIM, TOKENS = 3, 4, 8, 75
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}


def as_stored(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`values` [..., head_dim] as a cache of `dtype` stores them."""
    return quant.quantize(values, dtype) if dtype == torch.int8 else values.to(dtype)


def cache_of(block_size: int, heads: int, dtype: torch.dtype, num_blocks: int = 16):
    entry = HEAD_DIM + (2 if dtype == torch.int8 else 0)
    cache = torch.zeros(LAYERS, num_blocks, 2, block_size, heads, entry, dtype=dtype)
    return cache.view(torch.uint8).fill_(0x5A).view(dtype)  # not a value anyone writes


def write(cache: torch.Tensor, block_ids: list[int], values: torch.Tensor, first: int) -> None:
    """values [layers, 2, tokens, heads, dim] of tokens from `first` on, stored from slot 0
    of block_ids[0] on."""
    block_size = cache.shape[3]
    for t in range(values.shape[2]):
        stored = as_stored(values[:, :, t], cache.dtype)
        cache[:, block_ids[t // block_size], :, t % block_size] = stored


def read(cache: torch.Tensor, block_ids: list[int], tokens: range) -> torch.Tensor:
    block_size = cache.shape[3]
    return torch.stack(
        [cache[:, block_ids[t // block_size], :, t % block_size] for t in tokens], dim=2
    )


CASES = [  # (prefill tp, decode tp, prefill block, decode block, prefill dtype, decode dtype)
    (1, 2, 16, 16, "float32", "float32"),
    (2, 1, 16, 16, "float32", "float32"),
    (1, 1, 16, 32, "float32", "float32"),
    (1, 1, 32, 16, "float32", "float32"),
    (1, 1, 16, 16, "float32", "int8"),
    (2, 1, 32, 16, "int8", "float32"),
    (4, 2, 16, 32, "bfloat16", "int8"),
    (8, 1, 16, 16, "float32", "float32"),  # 4 heads over 8 ranks: each head on two ranks
    (1, 8, 16, 16, "float32", "float32"),
]


@pytest.mark.parametrize(("p_tp", "d_tp", "p_block", "d_block", "p_dtype", "d_dtype"), CASES)
def test_prefill_layout_lands_as_the_decode_rank_stores_it(
    p_tp: int, d_tp: int, p_block: int, d_block: int, p_dtype: str, d_dtype: str
) -> None:
    torch.manual_seed(0)
    rng = random.Random(1)
    p_type, d_type = DTYPES[p_dtype], DTYPES[d_dtype]
    kv = torch.randn(LAYERS, 2, TOKENS, HEADS, HEAD_DIM)
    cached = 2 * d_block  # the decode rank caches the first two of its blocks
    sent_from = cached // p_block * p_block  # the prefill side sends whole blocks of its own
    p_ids = rng.sample(range(16), -(-(TOKENS - sent_from) // p_block))
    sources = []
    for rank in range(p_tp):
        held = kv_head_range(HEADS, p_tp, rank)
        cache = cache_of(p_block, len(held), p_type)
        write(cache, p_ids, kv[:, :, sent_from:, held.start : held.stop], sent_from)
        sources.append(Source(cache, p_ids, sent_from, held))
    for rank in range(d_tp):
        heads = kv_head_range(HEADS, d_tp, rank)
        cache = cache_of(d_block, len(heads), d_type)
        d_ids = rng.sample(range(16), -(-TOKENS // d_block))
        before = cache.clone()
        land(cache, d_ids, heads, range(cached, TOKENS), sources)

        # What the decode rank's engine stores for these values, from the prefill's stored
        # values: exactly those when both sides store alike, else converted.
        expected = kv[:, :, cached:, heads.start : heads.stop]
        if p_type != d_type:
            expected = as_stored(expected, p_type)
            expected = (
                quant.dequantize(expected, torch.float32) if p_type == torch.int8 else expected
            )
            expected = as_stored(expected.float(), d_type)
        else:
            expected = as_stored(expected, d_type)
        got = read(cache, d_ids, range(cached, TOKENS))
        assert torch.equal(got.view(torch.uint8), expected.contiguous().view(torch.uint8))
        kept = read(cache, d_ids, range(cached))
        assert torch.equal(
            kept.view(torch.uint8), read(before, d_ids, range(cached)).view(torch.uint8)
        )


def test_a_missing_head_is_refused() -> None:
    cache = cache_of(16, 2, torch.float32)
    src = Source(cache_of(16, 1, torch.float32), [0, 1], 0, range(0, 1))
    with pytest.raises(ValueError, match=r"heads up to 1 of range\(0, 2\)"):
        land(cache, [0, 1], range(0, 2), range(0, 20), [src])
