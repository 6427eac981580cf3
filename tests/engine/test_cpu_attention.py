"""The CPU attention kernels (engine/cpu_kernels/paged_decode.cpp, and kv_int8.cpp for an int8
cache: decode and the quantizing write) against the torch paged path."""

from __future__ import annotations

import pytest
import torch

from engine.attention import cpu_paged
from engine.attention.backend import AttentionMetadata
from engine.attention.cpu_paged import load_kernel
from engine.attention.registry import get_backend
from engine.kv_cache import quant as kv_quant

pytestmark = pytest.mark.skipif(load_kernel() is None, reason="no C++ toolchain for the kernel")


def meta_for(tables: torch.Tensor, lens: torch.Tensor, block_size: int) -> AttentionMetadata:
    empty = torch.zeros(0, dtype=torch.long)
    return AttentionMetadata(
        block_size=block_size,
        slot_blocks=empty,
        slot_offsets=empty,
        num_decodes=len(lens),
        decode_block_tables=tables,
        decode_seq_lens=lens,
    )


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (12, 4), (6, 1)])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 128])
@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("cache", ["float32", "int8"])
def test_matches_torch_path(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, cache: str
) -> None:
    gen = torch.Generator().manual_seed(num_heads * 1000 + head_dim + block_size)
    num_blocks, max_blocks = 300, 64 // block_size + 3
    kv = torch.randn(num_blocks, 2, block_size, num_kv_heads, head_dim, generator=gen)
    if cache == "int8":
        kv = kv_quant.quantize(kv, torch.int8)
    lengths = [1, block_size, block_size + 1, max_blocks * block_size, 7, 2 * block_size]
    tables = torch.stack(
        [torch.randperm(num_blocks, generator=gen)[:max_blocks] for _ in lengths]
    )  # scattered blocks, never shared
    lens = torch.tensor(lengths)
    q = torch.randn(len(lengths), num_heads, head_dim, generator=gen)
    scale = head_dim**-0.5
    got = get_backend("cpu")._decode(q, kv, meta_for(tables, lens, block_size), scale)
    want = get_backend("torch")._decode(q, kv, meta_for(tables, lens, block_size), scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_dim", [64, 80, 36])
def test_a_bfloat16_cache_computes_what_float32_does_on_the_same_values(
    head_dim: int, monkeypatch
) -> None:
    """Entries widen to float32 exactly, so the bfloat16 kernel's result is the float32
    kernel's on the widened cache, rounded once: bit for bit, not within a tolerance. (The
    row-by-row kernel; scores on AMX sum in another order: the next test.)"""
    monkeypatch.setattr(cpu_paged, "_amx_kernel", lambda: None)
    gen = torch.Generator().manual_seed(head_dim)
    kv = torch.randn(80, 2, 16, 2, head_dim, generator=gen).bfloat16()
    lengths = [1, 16, 17, 90, 5]
    tables = torch.stack([torch.randperm(80, generator=gen)[:6] for _ in lengths])
    lens = torch.tensor(lengths)
    q = torch.randn(len(lengths), 6, head_dim, generator=gen).bfloat16()
    cpu, meta = get_backend("cpu"), meta_for(tables, lens, 16)
    got = cpu._decode(q, kv, meta, 0.1)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, cpu._decode(q.float(), kv.float(), meta, 0.1).bfloat16())
    want = get_backend("torch")._decode(q, kv, meta_for(tables, lens, 16), 0.1)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)  # torch's own bf16 rounding


@pytest.mark.skipif(cpu_paged._amx_kernel() is None, reason="no AMX on this CPU")
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(12, 4), (8, 1), (4, 4), (16, 2)])
@pytest.mark.parametrize(("block_size", "head_dim"), [(16, 64), (32, 64), (16, 128)])
def test_scores_on_amx_equal_the_row_by_row_kernels(
    num_heads: int, num_kv_heads: int, block_size: int, head_dim: int
) -> None:
    """Products of bfloat16 values are exact in float32 either way; only the order of the
    sums differs, so outputs and log-sum-exps agree to float32 rounding."""
    gen = torch.Generator().manual_seed(num_heads + block_size + head_dim)
    kv = torch.randn(120, 2, block_size, num_kv_heads, head_dim, generator=gen).bfloat16()
    lengths = [1, 15, 16, 17, 3 * block_size + 5, 8 * block_size]
    tables = torch.stack([torch.randperm(120, generator=gen)[:8] for _ in lengths])
    lens = torch.tensor(lengths)
    q = torch.randn(len(lengths), num_heads, head_dim, generator=gen).bfloat16().float()
    outs = [torch.empty(q.shape) for _ in range(2)]
    lses = [torch.empty(q.shape[:2]) for _ in range(2)]
    rows = get_backend("cpu")._kernel_for(torch.bfloat16)
    for kernel, out, lse in zip((rows, cpu_paged._amx_kernel()), outs, lses, strict=True):
        kernel(q, kv, tables, lens, head_dim**-0.5, out, lse)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lses[1], lses[0], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("amx", [False, True])
def test_sequences_from_the_work_queue_give_the_one_thread_answer(amx: bool) -> None:
    """The team takes sequences from a shared queue (engine/cpu_kernels/work_queue.h): every
    one is computed, once, as one thread alone computes it."""
    kernel = cpu_paged._amx_kernel() if amx else get_backend("cpu")._kernel_for(torch.bfloat16)
    if kernel is None:
        pytest.skip("no AMX on this CPU")
    gen = torch.Generator().manual_seed(5)
    kv = torch.randn(200, 2, 16, 4, 64, generator=gen).bfloat16()
    lengths = [1 + (37 * i) % 150 for i in range(23)]  # an odd count, lengths all different
    tables = torch.stack([torch.randperm(200, generator=gen)[:10] for _ in lengths])
    lens = torch.tensor(lengths)
    q = torch.randn(len(lengths), 12, 64, generator=gen).bfloat16()
    outs, threads = [], torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            out = torch.full_like(q, float("nan"))
            kernel(q, kv, tables, lens, 0.125, out)
            outs.append(out)
    finally:
        torch.set_num_threads(threads)
    assert not outs[0].isnan().any()
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])


@pytest.mark.parametrize("amx", [False, True])
def test_bfloat16_queries_and_output_are_the_float32_call_rounded_once(amx: bool) -> None:
    """The kernels widen bfloat16 queries and round their output themselves, so the backend
    writes a bfloat16 model's decode rows in place: bit for bit what widening the queries,
    a float32 output and one rounding give, into the first rows of the step's output only."""
    kernel = cpu_paged._amx_kernel() if amx else get_backend("cpu")._kernel_for(torch.bfloat16)
    if kernel is None:
        pytest.skip("no AMX on this CPU")
    gen = torch.Generator().manual_seed(11)
    kv = torch.randn(60, 2, 16, 4, 64, generator=gen).bfloat16()
    lengths = [1, 16, 33, 90]
    tables = torch.stack([torch.randperm(60, generator=gen)[:6] for _ in lengths])
    lens = torch.tensor(lengths)
    q = torch.randn(len(lengths), 12, 64, generator=gen).bfloat16()
    wide = torch.empty(q.shape)
    kernel(q.float(), kv, tables, lens, 0.125, wide)
    narrow = torch.empty_like(q)
    kernel(q, kv, tables, lens, 0.125, narrow)
    assert torch.equal(narrow, wide.bfloat16())
    if amx:  # the backend picks the AMX kernel for these shapes
        step_out = torch.full((len(lengths) + 3, 12, 64), 7.0, dtype=torch.bfloat16)
        meta = meta_for(tables, lens, 16)
        get_backend("cpu").decode_into(step_out[: len(lengths)], q, kv, meta, 0.125)
        assert torch.equal(step_out[: len(lengths)], narrow)
        assert torch.equal(step_out[len(lengths) :], torch.full((3, 12, 64), 7.0).bfloat16())
    with pytest.raises(RuntimeError, match="out must have q's shape"):
        kernel(q, kv, tables, lens, 0.125, narrow[:2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_write_stores_what_the_torch_path_stores(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(37, 3, 2, 80, generator=gen).to(dtype)
    k, v = qkv[:, 1], qkv[:, 2]  # strided views, as the attention layer's split gives
    slots = torch.randperm(20 * 16, generator=gen)[:37]
    meta = AttentionMetadata(
        block_size=16, slot_blocks=slots // 16, slot_offsets=slots % 16, num_decodes=0,
        decode_block_tables=torch.zeros(0, 1, dtype=torch.long),
        decode_seq_lens=torch.zeros(0, dtype=torch.long),
    )  # fmt: skip
    got = torch.zeros(20, 2, 16, 2, 80, dtype=dtype)
    want = torch.zeros_like(got)
    get_backend("cpu").write_kv(k, v, got, meta)
    get_backend("torch").write_kv(k, v, want, meta)
    assert torch.equal(got, want) and got.abs().sum() > 0
    with pytest.raises(RuntimeError, match="slot outside the cache"):
        far = AttentionMetadata(
            block_size=16, slot_blocks=torch.full((37,), 20), slot_offsets=slots % 16,
            num_decodes=0, decode_block_tables=meta.decode_block_tables,
            decode_seq_lens=meta.decode_seq_lens,
        )  # fmt: skip
        get_backend("cpu").write_kv(k, v, got, far)


def test_ignores_blocks_past_the_length() -> None:
    kv = torch.randn(10, 2, 16, 2, 64)
    tables = torch.tensor([[3, 7]])
    q = torch.randn(1, 4, 64)
    cpu = get_backend("cpu")
    before = cpu._decode(q, kv, meta_for(tables, torch.tensor([16]), 16), 0.125)
    kv[7] = float("nan")  # block 7 holds positions >= 16: never read
    after = cpu._decode(q, kv, meta_for(tables, torch.tensor([16]), 16), 0.125)
    assert torch.equal(before, after)


@pytest.mark.parametrize(("num_tokens", "num_kv_heads", "head_dim"), [(1, 4, 64), (37, 2, 80)])
def test_the_int8_write_stores_the_bytes_of_the_torch_path(
    num_tokens: int, num_kv_heads: int, head_dim: int
) -> None:
    gen = torch.Generator().manual_seed(num_tokens)
    qkv = torch.randn(num_tokens, 3, num_kv_heads, head_dim, generator=gen) * 3
    k, v = qkv[:, 1], qkv[:, 2]  # strided views, as the attention layer's split gives
    k[0, 0] = 0.0  # a zero row: the smallest scale
    # Exact ties x / scale = 2.5, -0.5, 3.5, which round half to even (2, 0, 4).
    scale = (torch.tensor(12.7) / 127).half().float()
    k[0, -1, :4] = torch.tensor([12.7, 2.5 * scale, -0.5 * scale, 3.5 * scale])
    slots = torch.randperm(20 * 16, generator=gen)[:num_tokens]
    meta = AttentionMetadata(
        block_size=16, slot_blocks=slots // 16, slot_offsets=slots % 16, num_decodes=0,
        decode_block_tables=torch.zeros(0, 1, dtype=torch.long),
        decode_seq_lens=torch.zeros(0, dtype=torch.long),
    )  # fmt: skip
    got = torch.zeros(20, 2, 16, num_kv_heads, head_dim + 2, dtype=torch.int8)
    want = torch.zeros_like(got)
    get_backend("cpu").write_kv(k, v, got, meta)
    get_backend("torch").write_kv(k, v, want, meta)
    assert torch.equal(got, want)
    tie_row = got[slots[0] // 16, 0, slots[0] % 16, -1]
    assert tie_row[1:4].tolist() == [2, 0, 4]
