"""Every Triton kernel of engine/kernels compiled for the GPU (real bf16 / fp16 dots, which
the interpreter tests never run) against its torch reference, at serving shapes: head_dim
64 and 128, GQA and MQA, block size 16, contexts of thousands of tokens.

Tolerances, per dtype:
- attention: the largest error of a sequence's outputs, relative to its largest |output|
  (long contexts average many values, so outputs shrink and a fixed atol would pass zeros):
  fp32 1e-4 (the reference sums thousands of terms in another order), fp16 2e-3 and bf16
  2e-2 (a few roundings of the probabilities and the output in that dtype);
- norm and rotary: assert_close's atol / rtol below (values are O(1));
- reshape_and_cache: exact (a copy); rotary_and_cache: exactly what rotary then
  reshape_and_cache write."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
from engine.kernels.int8_linear import int8_linear, int8_linear_ref
from engine.kernels.prefill_attention import (
    LaunchConfig,
    PrefillLayout,
    paged_prefill_attention,
    paged_prefill_attention_ref,
)
from engine.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref
from engine.kernels.rms_norm import rms_norm, rms_norm_ref
from engine.kernels.rotary import apply_rotary, apply_rotary_ref
from engine.kernels.rotary_cache import rotary_and_cache
from engine.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref
from engine.layers.rotary import RotaryEmbedding
from tests.support.paged_kv import make_paged_contexts, padded_table, poisoned

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ATTENTION_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}
ELEMENTWISE_TOLERANCE = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
PAGE = 16


def check_attention(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert not got.isnan().any(), f"{what}: NaN (a read past the context, or an unwritten row)"
    scale = want.float().abs().amax()
    error = (got.float() - want.float()).abs().amax()
    assert error <= ATTENTION_TOLERANCE[dtype] * scale, f"{what}: error {error} of {scale}"


# (query heads, kv heads, head_dim, context lengths, splits; None: the device's default)
DECODE_CASES = [
    (32, 8, 128, [1, 17, 1000, 4096], None),
    (32, 8, 128, [4096, 33], 1),  # one split: the kernel writes the output directly
    (8, 1, 128, [8191, 300], None),
    (16, 16, 64, [2048, 15, 16], None),
    (32, 4, 64, [5000, 2], 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk,dim,lens,splits", DECODE_CASES)
def test_decode_attention(hq, hk, dim, lens, splits, dtype) -> None:
    ctx = make_paged_contexts(lens, hk, dim, PAGE, dtype, seed=sum(lens), device=CUDA)
    gen = torch.Generator().manual_seed(dim)
    q = torch.randn(len(lens), hq, dim, generator=gen).to(dtype).to(CUDA)
    table = padded_table(ctx.block_ids, CUDA)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=CUDA)
    out = poisoned(tuple(q.shape), dtype, CUDA)
    got = paged_decode_attention(q, ctx.kv_layer, table, seq_lens, dim**-0.5, splits, out=out)
    want = paged_decode_attention_ref(q, ctx.kv_layer, table, seq_lens, dim**-0.5)
    for b, n in enumerate(lens):
        check_attention(got[b], want[b], dtype, f"sequence of {n} tokens")


LEADING_ROWS = 3  # rows before the chunks (the step's decode tokens): never written
# (query heads, kv heads, head_dim, [(query_len, seq_len) per chunk]): fresh prompts, extends
# over a long cached prefix, a one-token chunk, lengths off the block and tile boundaries.
PREFILL_CASES = [
    (32, 8, 128, [(2048, 2048), (1, 3000), (100, 1100), (37, 37)]),
    (16, 16, 64, [(512, 512), (300, 4096)]),
    (8, 1, 128, [(1000, 1000), (65, 129)]),
    (8, 2, 256, [(700, 700), (20, 333)]),
]


@pytest.mark.parametrize("whole_pages", [False, True], ids=["gather", "whole_pages"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk,dim,chunks", PREFILL_CASES)
def test_prefill_attention(hq, hk, dim, chunks, dtype, whole_pages) -> None:
    """Both ways of reading keys: gathered (the default launch) and whole pages through
    tensor descriptors (TMA on Hopper)."""
    query_lens = [q for q, _ in chunks]
    ctx = make_paged_contexts([s for _, s in chunks], hk, dim, PAGE, dtype, seed=dim, device=CUDA)
    starts = [LEADING_ROWS + sum(query_lens[:i]) for i in range(len(chunks))]
    layout = PrefillLayout.build(starts, query_lens, ctx.seq_lens, ctx.block_ids, CUDA)
    gen = torch.Generator().manual_seed(hq)
    q = torch.randn(LEADING_ROWS + sum(query_lens), hq, dim, generator=gen).to(dtype).to(CUDA)
    out = poisoned(tuple(q.shape), dtype, CUDA)
    config = LaunchConfig(PAGE, 4, 2, whole_pages=True) if whole_pages else None
    got = paged_prefill_attention(q, ctx.kv_layer, layout, dim**-0.5, out, config)
    want = paged_prefill_attention_ref(q, ctx.kv_layer, layout, dim**-0.5)
    assert got[:LEADING_ROWS].isnan().all(), "rows outside the chunks were written"
    for start, (q_len, n) in zip(starts, chunks, strict=True):
        rows = slice(start, start + q_len)
        check_attention(got[rows], want[rows], dtype, f"chunk of {q_len} over {n} tokens")


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache(dtype) -> None:
    hk, dim, num_tokens, num_blocks = 8, 128, 300, 40
    kv = poisoned((num_blocks, 2, PAGE, hk, dim), dtype, CUDA)
    want = kv.clone()
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(num_blocks * PAGE, generator=gen)[:num_tokens].to(CUDA)
    blocks, offsets = (slots // PAGE).int(), (slots % PAGE).int()
    blocks[7] = -1  # a padding token: written nowhere
    k = torch.randn(num_tokens, hk, dim, generator=gen).to(dtype).to(CUDA)
    v = torch.randn(num_tokens, 2 * hk, dim, generator=gen).to(dtype).to(CUDA)[:, :hk]  # strided
    reshape_and_cache(k, v, kv, blocks, offsets)
    reshape_and_cache_ref(k, v, want, blocks, offsets)
    torch.testing.assert_close(kv, want, equal_nan=True, rtol=0, atol=0)


QUANTIZED_CACHES = [torch.int8, torch.float8_e4m3fn]


@pytest.mark.parametrize("cache", QUANTIZED_CACHES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reshape_and_cache_into_a_quantized_cache(cache, dtype) -> None:
    """The kernel's quantization writes the bytes kv_quant.quantize writes (exact)."""
    hk, dim, num_tokens, num_blocks = 8, 128, 300, 40
    kv = torch.zeros((num_blocks, 2, PAGE, hk, dim + 2), dtype=cache, device=CUDA)
    want = kv.clone()
    gen = torch.Generator().manual_seed(1)
    slots = torch.randperm(num_blocks * PAGE, generator=gen)[:num_tokens].to(CUDA)
    blocks, offsets = (slots // PAGE).int(), (slots % PAGE).int()
    k = (torch.randn(num_tokens, hk, dim, generator=gen) * 4).to(dtype).to(CUDA)
    v = torch.randn(num_tokens, hk, dim, generator=gen).to(dtype).to(CUDA)
    reshape_and_cache(k, v, kv, blocks, offsets)
    reshape_and_cache_ref(k, v, want, blocks, offsets)
    assert torch.equal(kv.view(torch.int8), want.view(torch.int8))


@pytest.mark.parametrize("cache", QUANTIZED_CACHES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_over_a_quantized_cache(cache, dtype) -> None:
    """Decode and prefill read int8 / fp8 entries and their scales: the references read the
    dequantized values."""
    from engine.kv_cache.quant import quantize

    hq, hk, dim, lens = 32, 8, 128, [3000, 17, 1]
    ctx = make_paged_contexts(lens, hk, dim, PAGE, torch.float32, seed=5, device=CUDA)
    kv = quantize(ctx.kv_layer, cache)  # the spare slots' scales are NaN: poison
    table = padded_table(ctx.block_ids, CUDA)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=CUDA)
    q = torch.randn(len(lens), hq, dim, generator=torch.Generator().manual_seed(6))
    q = q.to(dtype).to(CUDA)
    got = paged_decode_attention(q, kv, table, seq_lens, dim**-0.5)
    want = paged_decode_attention_ref(q, kv, table, seq_lens, dim**-0.5)
    for b, n in enumerate(lens):
        check_attention(got[b], want[b], dtype, f"decode over {n} {cache} tokens")
    layout = PrefillLayout.build([0, 100], [100, 17], [3000, 17], ctx.block_ids[:2], CUDA)
    qp = torch.randn(117, hq, dim, generator=torch.Generator().manual_seed(7)).to(dtype).to(CUDA)
    got = paged_prefill_attention(qp, kv, layout, dim**-0.5)
    want = paged_prefill_attention_ref(qp, kv, layout, dim**-0.5)
    check_attention(got, want, dtype, f"prefill over {cache}")


NORM_CASES = [(1, 4096, True), (300, 5120, True), (7, 2048, False)]  # rows, hidden, residual


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden,fused", NORM_CASES)
def test_rms_norm(rows: int, hidden: int, fused: bool, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(hidden)
    x, residual, weight = (
        torch.randn(shape, generator=gen).to(dtype).to(CUDA)
        for shape in ((rows, hidden), (rows, hidden), (hidden,))
    )
    out, new_residual = rms_norm(x, weight, 1e-5, residual if fused else None)
    want, want_residual = rms_norm_ref(x, weight, 1e-5, residual if fused else None)
    torch.testing.assert_close(out, want, **ELEMENTWISE_TOLERANCE[dtype])
    torch.testing.assert_close(new_residual, want_residual, **ELEMENTWISE_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,intermediate", [(1, 14336), (300, 5632), (7, 1000)])
def test_silu_and_mul(rows: int, intermediate: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(intermediate)
    gate_up = (4 * torch.randn(rows, 2 * intermediate, generator=gen)).to(dtype).to(CUDA)
    torch.testing.assert_close(
        silu_and_mul(gate_up), silu_and_mul_ref(gate_up), **ELEMENTWISE_TOLERANCE[dtype]
    )


LLAMA3 = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "hq,hk,dim,scaling,neox", [(32, 8, 128, LLAMA3, True), (16, 16, 64, None, False)]
)
def test_rotary(hq: int, hk: int, dim: int, scaling, neox: bool, dtype: torch.dtype) -> None:
    rope = RotaryEmbedding(dim, 32768, 500000.0, scaling, dtype).to(CUDA)
    gen = torch.Generator().manual_seed(dim)
    positions = torch.randint(0, 32768, (257,), generator=gen).to(CUDA)
    # q and k as strided views of one fused projection, as the attention layer has them.
    qkv = torch.randn(257, (hq + 2 * hk) * dim, generator=gen).to(dtype).to(CUDA)
    q = qkv[:, : hq * dim].view(257, hq, dim)
    k = qkv[:, hq * dim : (hq + hk) * dim].view(257, hk, dim)
    want_q, want_k = apply_rotary_ref(positions, q, k, rope.cos, rope.sin, neox)
    untouched = qkv[:, (hq + hk) * dim :].clone()
    got_q, got_k = apply_rotary(positions, q, k, rope.cos, rope.sin, neox)
    torch.testing.assert_close(got_q, want_q, **ELEMENTWISE_TOLERANCE[dtype])
    torch.testing.assert_close(got_k, want_k, **ELEMENTWISE_TOLERANCE[dtype])
    assert torch.equal(qkv[:, (hq + hk) * dim :], untouched), "v was written"


@pytest.mark.parametrize("cache", [None, *QUANTIZED_CACHES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rotary_and_cache_writes_what_the_two_kernels_write(cache, dtype) -> None:
    hq, hk, dim, num_tokens, num_blocks = 32, 8, 128, 300, 40
    rope = RotaryEmbedding(dim, 32768, 500000.0, LLAMA3, dtype).to(CUDA)
    gen = torch.Generator().manual_seed(2)
    positions = torch.randint(0, 32768, (num_tokens,), generator=gen).to(CUDA)
    slots = torch.randperm(num_blocks * PAGE, generator=gen)[:num_tokens].to(CUDA)
    blocks, offsets = (slots // PAGE).int(), (slots % PAGE).int()
    blocks[7] = -1  # a padding token: rotated, written nowhere
    qkv = (torch.randn(num_tokens, (hq + 2 * hk) * dim, generator=gen) * 4).to(dtype).to(CUDA)
    want_qkv = qkv.clone()
    if cache is None:
        kv = poisoned((num_blocks, 2, PAGE, hk, dim), dtype, CUDA)
    else:
        kv = torch.zeros((num_blocks, 2, PAGE, hk, dim + 2), dtype=cache, device=CUDA)
    want_kv = kv.clone()
    for tensor, cache_layer, fused in ((qkv, kv, True), (want_qkv, want_kv, False)):
        q, k, v = tensor.split([hq * dim, hk * dim, hk * dim], dim=-1)
        q, k, v = q.view(-1, hq, dim), k.view(-1, hk, dim), v.view(-1, hk, dim)
        if fused:
            rotary_and_cache(positions, q, k, v, rope.cos, rope.sin, cache_layer, blocks, offsets)
        else:
            apply_rotary(positions, q, k, rope.cos, rope.sin)
            reshape_and_cache(k, v, cache_layer, blocks, offsets)
    assert torch.equal(qkv, want_qkv)
    assert torch.equal(kv.view(torch.uint8), want_kv.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 16, 100, 1000])
def test_int8_linear(dtype: torch.dtype, rows: int) -> None:
    from engine.layers.quant import quantize_weight

    gen = torch.Generator().manual_seed(rows)
    wq, scale = quantize_weight(torch.randn(2048, 1024, generator=gen))
    x = torch.randn(rows, 1024, generator=gen).to(CUDA, dtype)
    bias = torch.randn(2048, generator=gen).to(CUDA, dtype)
    wq, scale = wq.to(CUDA), scale.to(CUDA)
    got = int8_linear(x, wq, scale, bias).float()
    want = int8_linear_ref(x, wq, scale, bias).float()
    # Sums of 1,024 products of O(1) values x O(100) weights: relative to the largest output.
    err = (got - want).abs().max() / want.abs().max()
    assert float(err) < ATTENTION_TOLERANCE[dtype]
