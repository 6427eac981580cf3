"""Paged decode attention (Triton, under the interpreter) against its torch reference."""

from __future__ import annotations

import inspect
import os

# Read when `@triton.jit` runs: set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from engine.attention.backend import AttentionMetadata, DecodeWorkspace
from engine.attention.triton_backend import TritonPagedAttention
from engine.kernels.decode_attention import (
    DecodeLaunch,
    _decode_reduce_kernel,
    _decode_split_kernel,
    paged_decode_attention,
    paged_decode_attention_ref,
)
from tests.engine.test_kernels_common import TOLERANCE
from tests.support.paged_kv import make_paged_contexts, padded_table, poisoned, to_page_one

# (query heads, kv heads, head_dim, page, context lengths, splits, dtype): GQA ratios 1, 2,
# 4 and MQA; lengths of 1 and at block boundaries; head sizes sampled sparingly.
CASES = [
    (4, 4, 64, 16, [1, 16, 17], 1, torch.float32),
    (8, 2, 80, 32, [31, 32, 33, 64], 2, torch.float32),
    (4, 1, 96, 16, [5, 48], 3, torch.bfloat16),
    (2, 1, 128, 16, [1, 100], 4, torch.float16),
    (4, 2, 256, 32, [40, 1], 2, torch.float32),
]


def run(q, ctx, splits, dtype):
    out = poisoned(tuple(q.shape), dtype)
    lens = torch.tensor(ctx.seq_lens, dtype=torch.int32)
    return paged_decode_attention(
        q, ctx.kv_layer, padded_table(ctx.block_ids), lens, 0.125, splits, out=out
    )


@pytest.mark.parametrize("hq,hk,dim,page,lens,splits,dtype", CASES)
def test_matches_reference(hq, hk, dim, page, lens, splits, dtype) -> None:
    ctx = make_paged_contexts(lens, hk, dim, page, dtype, seed=len(lens) + dim)
    q = torch.randn(len(lens), hq, dim).to(dtype)
    got = run(q, ctx, splits, dtype)
    lens_t = torch.tensor(lens)
    want = paged_decode_attention_ref(q, ctx.kv_layer, padded_table(ctx.block_ids), lens_t, 0.125)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_block_size_16_gives_the_block_size_1_answer() -> None:
    ctx = make_paged_contexts([1, 16, 33], 2, 64, 16, torch.float32, seed=1)
    q = torch.randn(3, 4, 64)
    paged = run(q, ctx, 1, torch.float32)
    flat = run(q, to_page_one(ctx), 1, torch.float32)
    torch.testing.assert_close(paged, flat, **TOLERANCE[torch.float32])


def test_split_count_does_not_change_the_answer() -> None:
    ctx = make_paged_contexts([3, 70], 1, 64, 16, torch.float32, seed=2)
    q = torch.randn(2, 2, 64)
    # More splits than a short context has tokens leaves splits empty; they must weigh 0.
    one, many = run(q, ctx, 1, torch.float32), run(q, ctx, 5, torch.float32)
    torch.testing.assert_close(one, many, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("splits", [2, 5])
def test_given_scratch_buffers_give_the_reference_answer(splits: int) -> None:
    # As a captured graph passes them: views into buffers made for a larger batch and more
    # splits, poisoned, so an unwritten split that the reduce read would show as NaN.
    ctx = make_paged_contexts([1, 20, 70], 2, 64, 16, torch.float32, seed=3)
    q = torch.randn(3, 4, 64)
    partial = poisoned((8, 4, 16, 64), torch.float32)[:3, :, :splits]
    lse = poisoned((8, 4, 16), torch.float32)[:3, :, :splits]
    lens = torch.tensor(ctx.seq_lens, dtype=torch.int32)
    table = padded_table(ctx.block_ids)
    got = paged_decode_attention(
        q, ctx.kv_layer, table, lens, 0.125, splits, poisoned((3, 4, 64), torch.float32),
        partial, lse,
    )  # fmt: skip
    want = paged_decode_attention_ref(q, ctx.kv_layer, table, lens, 0.125)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


def test_scratch_buffers_need_their_split_count_and_shape() -> None:
    ctx = make_paged_contexts([5], 1, 64, 16, torch.float32, seed=4)
    q, lens, table = torch.randn(1, 2, 64), torch.tensor([5]), padded_table(ctx.block_ids)
    partial, lse = torch.empty(1, 2, 2, 64), torch.empty(1, 2, 2)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode_attention(q, ctx.kv_layer, table, lens, 0.1, None, None, partial, lse)
    with pytest.raises(ValueError, match="partial has shape"):
        paged_decode_attention(q, ctx.kv_layer, table, lens, 0.1, 3, None, partial, lse)


def test_split_count_is_not_a_compile_time_constant() -> None:
    # A constexpr split count compiles the kernels again for each count (`.fn`: the Python
    # function under both the compiler and the interpreter).
    for kernel in (_decode_split_kernel, _decode_reduce_kernel):
        param = inspect.signature(kernel.fn).parameters["NUM_SPLITS"]
        assert param.annotation is inspect.Parameter.empty


def test_triton_backend_decodes_into_the_steps_workspace() -> None:
    # A captured step's metadata carries a fixed split count and its scratch.
    ctx = make_paged_contexts([9, 40], 2, 64, 16, torch.float32, seed=5)
    q = torch.randn(2, 4, 64)
    table, lens = padded_table(ctx.block_ids), torch.tensor(ctx.seq_lens)
    f32 = torch.float32
    workspace = DecodeWorkspace(3, poisoned((2, 4, 3, 64), f32), poisoned((2, 4, 3), f32))
    meta = AttentionMetadata(
        block_size=16,
        slot_blocks=torch.zeros(2, dtype=torch.long),
        slot_offsets=torch.zeros(2, dtype=torch.long),
        num_decodes=2,
        decode_block_tables=table,
        decode_seq_lens=lens,
        decode_workspace=workspace,
    )
    out = poisoned((2, 4, 64), f32)
    TritonPagedAttention().decode_into(out, q, ctx.kv_layer, meta, 0.125)
    want = paged_decode_attention_ref(q, ctx.kv_layer, table, lens, 0.125)
    torch.testing.assert_close(out, want, **TOLERANCE[f32])
    assert not workspace.lse.isnan().any()  # the split results went there


@pytest.mark.parametrize("splits", [1, 3])
def test_rows_of_no_context_are_left_as_they_were(splits: int) -> None:
    """A captured mixed step gives the decode kernel every row; those that are not decodes
    have context 0 and keep what the prefill kernel (or nobody) wrote there."""
    ctx = make_paged_contexts([9, 40], 2, 64, 16, torch.float32, seed=6)
    q = torch.randn(4, 4, 64)
    lens = torch.tensor([*ctx.seq_lens, 0, 0], dtype=torch.int32)
    table = padded_table([*ctx.block_ids, [0], [0]])
    got = run_rows(q, ctx.kv_layer, table, lens, splits)
    want = paged_decode_attention_ref(q[:2], ctx.kv_layer, table[:2], lens[:2], 0.125)
    assert got[2:].isnan().all(), "a row of context 0 was written"
    torch.testing.assert_close(got[:2], want, **TOLERANCE[torch.float32])


def run_rows(q, kv_layer, table, lens, splits):
    return paged_decode_attention(
        q, kv_layer, table, lens, 0.125, splits, out=poisoned(tuple(q.shape), q.dtype)
    )


@pytest.mark.parametrize("block_n,splits", [(16, 1), (64, 3)])
def test_every_keys_a_step_gives_the_reference_answer(block_n: int, splits: int) -> None:
    """The launches the tuning tries (bench/engine/decode_tuning.py): other key steps, with
    one split and several."""
    ctx = make_paged_contexts([1, 70, 130], 2, 64, 16, torch.float32, seed=block_n)
    q = torch.randn(3, 4, 64)
    lens = torch.tensor(ctx.seq_lens, dtype=torch.int32)
    launch = DecodeLaunch(block_n=block_n, num_warps=8, num_stages=2)
    table = padded_table(ctx.block_ids)
    got = paged_decode_attention(q, ctx.kv_layer, table, lens, 0.125, splits, launch=launch)
    want = paged_decode_attention_ref(q, ctx.kv_layer, table, lens, 0.125)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])
