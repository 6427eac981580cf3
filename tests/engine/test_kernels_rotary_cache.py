"""Rotary and the KV cache write in one kernel (engine/kernels/rotary_cache.py), under the
interpreter: the same q, k and cache bytes as the rotary kernel then reshape-and-cache, for
every dtype, quantized cache, pair layout and padding token; the references' values; its
argument checks. The engine's Triton path runs through it in
tests/engine/test_kernels_engine.py (greedy tokens against transformers)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from engine.kernels.reshape_and_cache import reshape_and_cache
from engine.kernels.rotary import apply_rotary
from engine.kernels.rotary_cache import rotary_and_cache, rotary_and_cache_ref
from engine.layers.rotary import RotaryEmbedding
from tests.support.paged_kv import poisoned

PAGE = 8
BLOCKS = torch.tensor([3, 0, 4, -1, 1, 3], dtype=torch.int32)  # -1: padding, stored nowhere
OFFSETS = torch.tensor([0, PAGE - 1, 5, 2, 7, PAGE - 1], dtype=torch.int32)
POSITIONS = torch.tensor([0, 1, 63, 64, 200, 7])


def step(hq: int, hk: int, dim: int, dtype: torch.dtype, seed: int = 0):
    """q, k, v as strided views of one fused projection (as the attention layer has them)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = (3 * torch.randn(len(POSITIONS), (hq + 2 * hk) * dim, generator=gen)).to(dtype)
    q, k, v = qkv.split([hq * dim, hk * dim, hk * dim], dim=-1)
    return qkv, q.view(-1, hq, dim), k.view(-1, hk, dim), v.view(-1, hk, dim)


def cache(hk: int, dim: int, dtype: torch.dtype, quantized: torch.dtype | None):
    if quantized is None:
        return poisoned((5, 2, PAGE, hk, dim), dtype)
    return torch.zeros(5, 2, PAGE, hk, dim + 2, dtype=quantized)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("quantized", [None, torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("hq,hk,dim,neox", [(4, 2, 64, True), (3, 3, 80, False), (8, 1, 128, True)])
def test_writes_what_rotary_then_reshape_and_cache_write(hq, hk, dim, neox, dtype, quantized):
    rope = RotaryEmbedding(dim, 256, 10000.0, None, dtype)
    qkv, q, k, v = step(hq, hk, dim, dtype)
    want_qkv, want_q, want_k, want_v = step(hq, hk, dim, dtype)
    kv = cache(hk, dim, dtype, quantized)
    want_kv = kv.clone()
    got_q, got_k = rotary_and_cache(POSITIONS, q, k, v, rope.cos, rope.sin, kv, BLOCKS, OFFSETS,
                                    neox)  # fmt: skip
    apply_rotary(POSITIONS, want_q, want_k, rope.cos, rope.sin, neox)
    reshape_and_cache(want_k, want_v, want_kv, BLOCKS, OFFSETS)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()  # in place
    assert torch.equal(qkv, want_qkv)  # q and k rotated alike, v not written
    # Bytes: NaN poison in the unwritten slots, and a quantized cache's scales.
    assert torch.equal(kv.view(torch.uint8), want_kv.view(torch.uint8))


@pytest.mark.parametrize(
    "dtype,quantized", [(torch.float32, None), (torch.bfloat16, None), (torch.float32, torch.int8)]
)
def test_matches_the_references(dtype, quantized) -> None:
    # A quantized cache from float32 only: a 16-bit key one rounding apart from the
    # reference's (the tolerance) can quantize one step apart; and fp8 not at all, as the
    # interpreter rounds float32 -> fp8 wrongly just below a power of two
    # (tests/engine/test_kernels_kv_quant.py). The test above holds those to the two kernels.
    rope = RotaryEmbedding(64, 256, 500000.0, None, dtype)
    _, q, k, v = step(4, 2, 64, dtype, seed=1)
    ref_q, ref_k, ref_v = q.clone(), k.clone(), v.clone()
    kv = cache(2, 64, dtype, quantized)
    want_kv = kv.clone()
    rotary_and_cache(POSITIONS, q, k, v, rope.cos, rope.sin, kv, BLOCKS, OFFSETS)
    want_q, want_k = rotary_and_cache_ref(
        POSITIONS, ref_q, ref_k, ref_v, rope.cos, rope.sin, want_kv, BLOCKS, OFFSETS
    )
    tolerance = dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.05, rtol=0.02)
    torch.testing.assert_close(q, want_q, **tolerance)
    torch.testing.assert_close(k, want_k, **tolerance)
    if quantized is None:
        torch.testing.assert_close(kv, want_kv, equal_nan=True, **tolerance)
    else:
        assert torch.equal(kv.view(torch.int8), want_kv.view(torch.int8))


def test_refuses_bad_arguments() -> None:
    rope = RotaryEmbedding(64, 256, 10000.0, None, torch.float32)
    _, q, k, v = step(4, 2, 64, torch.float32)
    kv = cache(2, 64, torch.float32, None)
    with pytest.raises(ValueError, match="positions has shape"):
        rotary_and_cache(POSITIONS[:3], q, k, v, rope.cos, rope.sin, kv, BLOCKS, OFFSETS)
    with pytest.raises(ValueError, match="the cache holds 2 of 32"):
        narrow = cache(2, 32, torch.float32, None)
        rotary_and_cache(POSITIONS, q, k, v, rope.cos, rope.sin, narrow, BLOCKS, OFFSETS)
    with pytest.raises(ValueError, match="slot_offsets has shape"):
        rotary_and_cache(POSITIONS, q, k, v, rope.cos, rope.sin, kv, BLOCKS, OFFSETS[:2])
