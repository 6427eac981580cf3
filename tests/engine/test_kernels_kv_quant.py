"""The Triton kernels over a quantized KV cache (int8 / fp8 entries with a float16 scale:
engine/kv_cache/quant.py), under the interpreter: reshape-and-cache writes the bytes
`kv_quant.quantize` writes, decode and prefill attention match their references over the
dequantized values, and the engine's Triton path serves from an int8 cache."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from engine import LLM
from engine.kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
from engine.kernels.prefill_attention import (
    PrefillLayout,
    paged_prefill_attention,
    paged_prefill_attention_ref,
)
from engine.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref
from engine.kv_cache import quant as kv_quant
from tests.engine.test_kernels_common import TOLERANCE
from tests.engine.test_parity import GREEDY, make_prompts
from tests.support.paged_kv import make_paged_contexts, padded_table, poisoned

CACHES = [torch.int8, torch.float8_e4m3fn]


def quantized_contexts(lens: list[int], hk: int, dim: int, page: int, cache: torch.dtype):
    """Random contexts in a quantized cache; the other slots' scales are NaN (poison)."""
    ctx = make_paged_contexts(lens, hk, dim, page, torch.float32, seed=len(lens) + dim)
    ctx.kv_layer = kv_quant.quantize(ctx.kv_layer, cache)
    return ctx


# int8 only here: the interpreter (Triton 3.x) rounds float32 -> fp8 wrongly just below a
# power of two (124 -> 64), so fp8 writes are checked on a GPU (tests/gpu).
@pytest.mark.parametrize("cache", [torch.int8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reshape_and_cache_writes_the_bytes_quantize_writes(cache, dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    k = (torch.randn(6, 2, 24, generator=gen) * 3).to(dtype)
    v = torch.randn(6, 2, 24, generator=gen).to(dtype)
    k[2, 1] = 0.0  # a zero row keeps the smallest scale
    blocks = torch.tensor([3, 0, 3, 1, -1, 2])  # -1: a padding token, written nowhere
    offsets = torch.tensor([1, 0, 2, 3, 0, 3])
    got = torch.zeros(4, 2, 4, 2, 26, dtype=cache)
    want = torch.zeros_like(got)
    reshape_and_cache(k, v, got, blocks, offsets)
    reshape_and_cache_ref(k, v, want, blocks, offsets)
    assert torch.equal(got.view(torch.int8), want.view(torch.int8))


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_over_a_quantized_cache_matches_the_reference(cache, splits) -> None:
    ctx = quantized_contexts([1, 16, 40], 2, 32, 16, cache)
    q = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(1))
    lens = torch.tensor(ctx.seq_lens, dtype=torch.int32)
    table = padded_table(ctx.block_ids)
    got = paged_decode_attention(
        q, ctx.kv_layer, table, lens, 0.125, splits, out=poisoned(tuple(q.shape), q.dtype)
    )
    want = paged_decode_attention_ref(q, ctx.kv_layer, table, lens, 0.125)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("cache", CACHES)
def test_prefill_over_a_quantized_cache_matches_the_reference(cache) -> None:
    ctx = quantized_contexts([20, 37], 1, 32, 16, cache)
    # Chunk 0: the last 12 of 20 tokens (8 cached before it); chunk 1: all 37.
    layout = PrefillLayout.build([0, 12], [12, 37], ctx.seq_lens, ctx.block_ids, "cpu")
    q = torch.randn(49, 2, 32, generator=torch.Generator().manual_seed(2))
    got = paged_prefill_attention(q, ctx.kv_layer, layout, 0.2, out=poisoned((49, 2, 32), q.dtype))
    want = paged_prefill_attention_ref(q, ctx.kv_layer, layout, 0.2)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


def test_the_triton_path_serves_from_an_int8_cache(tiny_model_dir, monkeypatch) -> None:
    """Every chunk reads its K/V from the cache on this path (fresh ones too), so its tokens
    are compared with the float32 cache's, not with transformers'."""
    monkeypatch.setenv("BATON_ATTENTION", "triton")
    model_dir = tiny_model_dir("llama")
    prompts = [make_prompts(1000)[i] for i in (4, 7)]
    runs = {}
    for kv in ("auto", "int8"):
        llm = LLM(model_dir, num_kv_blocks=64, max_num_batched_tokens=24, kv_cache_dtype=kv)
        assert llm.engine.runner.model.model.layers[0].self_attn.backend.name == "triton"
        runs[kv] = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    assert llm.engine.runner.kv_cache.dtype == torch.int8
    assert runs["int8"] == runs["auto"]
