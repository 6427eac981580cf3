"""Paged decode attention: one query token per sequence against its block table.

Split-KV (flash-decoding): each sequence's context is cut into `num_splits` contiguous
ranges that run in parallel; a second kernel merges the partial results by their
log-sum-exp. With one split the first kernel writes the output directly (`DIRECT`).

    context of sequence b:  [ split 0 | split 1 | ... | split S-1 ]   (each cdiv(len, S))
    stage 1, grid (B, Hk, S):  partial[b, h, s] = softmax(q K_s^T) V_s,  lse[b, h, s]
    stage 2, grid (B, Hq):     out[b, h] = sum_s exp(lse_s - max) partial_s / sum_s exp(...)

One program serves all query heads of one KV head (GQA/MQA), padded to at least 16 rows so
`tl.dot` gets a legal tile; K/V of a token are found through the block table, token by
token, so any block size (including 1) works with any tile width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.kernels import tuned
from engine.kernels._checks import (
    INDEX_DTYPES,
    QUANTIZED_CACHE,
    check,
    check_shape,
    check_tensor,
    dot_dtype,
    dot_precision,
    next_pow2,
)
from engine.kernels._paged_attention import (
    attend_paged_kv,
    cached_values,
    check_paged_attention,
    initial_state,
)

MAX_SPLITS = 16


@dataclass(frozen=True)
class DecodeLaunch:
    """How the split kernel is launched: keys a loop step, warps, pipeline stages."""

    block_n: int
    num_warps: int
    num_stages: int


def decode_launch(
    dtype: torch.dtype, head_dim: int, device: torch.device | None = None
) -> DecodeLaunch:
    """The device's tuned entry where it has one (engine/kernels/tuned.py; the device check
    times the candidates, bench/engine/decode_tuning.py), else 32 keys a step (16 above
    head_dim 128) on Triton's default 4 warps and 3 stages."""
    entry = tuned.decode_entry(device, dtype, head_dim)
    if entry is not None:
        return DecodeLaunch(**entry)
    return DecodeLaunch(block_n=32 if head_dim <= 128 else 16, num_warps=4, num_stages=3)


# NUM_SPLITS only bounds ranges and masks, so it is a runtime argument, unspecialised (Triton
# would otherwise compile apart the values 1 and multiples of 16): one compiled kernel serves
# every split count. DIRECT (one split) stays a constant: it removes the lse store.
@triton.jit(do_not_specialize=["NUM_SPLITS"])
def _decode_split_kernel(
    q_ptr, kv_ptr, table_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    scale, NUM_SPLITS,
    stride_qb, stride_qh,
    stride_kvb, stride_kvkv, stride_kvs, stride_kvh,
    stride_tb,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr, QUANT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    if seq_len == 0:
        return  # not a decode row (a captured step's prefill or padding rows): not ours
    split_len = tl.cdiv(seq_len, NUM_SPLITS)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    rows = tl.arange(0, BLOCK_H)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    m, denom, acc = initial_state(BLOCK_H, BLOCK_D)
    m, denom, acc = attend_paged_kv(
        m, denom, acc, q, None, kv_ptr, table_ptr, b, kv_head, start, end, scale,
        stride_tb, stride_kvb, stride_kvkv, stride_kvs, stride_kvh,
        BLOCK_H, HEAD_DIM, PAGE, BLOCK_N, BLOCK_D, False, PRECISION, DOT, QUANT,
    )  # fmt: skip

    # An empty split (context shorter than the split count) leaves denom 0: write zeros and
    # lse = -inf so the reduce gives it no weight.
    safe = tl.where(denom > 0, denom, 1.0)
    out = acc / safe[:, None]
    o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])
    if not DIRECT:
        lse = tl.where(denom > 0, m + tl.log(safe), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=row_mask)


@triton.jit(do_not_specialize=["NUM_SPLITS"])
def _decode_reduce_kernel(
    partial_ptr, lse_ptr, out_ptr, seq_lens_ptr, NUM_SPLITS,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    if tl.load(seq_lens_ptr + b) == 0:
        return
    s = tl.arange(0, BLOCK_S)
    s_mask = s < NUM_SPLITS
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + s, mask=s_mask, other=float("-inf"))
    # Split 0 is never empty (seq_len >= 1), so the maximum is finite.
    weight = tl.exp(lse - tl.max(lse, 0))
    parts = tl.load(
        partial_ptr + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask
    )


def default_num_splits(
    batch: int, num_kv_heads: int, max_context: int, device: torch.device
) -> int:
    """Enough programs to fill the device, never a split shorter than a few tiles."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = triton.cdiv(2 * sms, max(1, batch * num_kv_heads))
    return max(1, min(wanted, MAX_SPLITS, triton.cdiv(max_context, 256)))


def paged_decode_attention(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    partial: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    launch: DecodeLaunch | None = None,
) -> torch.Tensor:
    """q: [B, Hq, D]; kv_layer: [num_blocks, 2, block_size, Hk, D]; block_tables:
    [B, max_blocks] (padding entries are never read past `seq_lens`); seq_lens: [B], the
    context length including the new token; a row of length 0 is not a decode row (a
    captured mixed step's prompt or padding rows): its `out` row is left as it was.
    Returns [B, Hq, D] (into `out`).

    `partial` ([B, Hq, num_splits, D]) and `lse` ([B, Hq, num_splits]), float32, are the
    split results' scratch; given (with `num_splits`), nothing is allocated and the launch
    depends on no value in the tensors, as a captured CUDA graph needs. `launch`:
    `decode_launch`'s unless given (the tuning)."""
    out, page, num_kv_heads = check_paged_attention(q, kv_layer, out)
    check_tensor("block_tables", block_tables, 2, INDEX_DTYPES, q.device)
    check_tensor("seq_lens", seq_lens, 1, INDEX_DTYPES, q.device)
    batch, num_heads, head_dim = q.shape
    check(
        block_tables.shape[0] == batch,
        f"block_tables has {block_tables.shape[0]} rows for {batch} queries",
    )
    check_shape("seq_lens", seq_lens, (batch,))
    check(
        (partial is None) == (lse is None) and (partial is None or num_splits is not None),
        "partial and lse come together, with num_splits",
    )
    if batch == 0:
        return out
    max_context = block_tables.shape[1] * page
    splits = num_splits or default_num_splits(batch, num_kv_heads, max_context, q.device)
    check(1 <= splits <= MAX_SPLITS, f"num_splits must be in [1, {MAX_SPLITS}], got {splits}")
    group = num_heads // num_kv_heads
    block_d = next_pow2(head_dim)
    launch = launch or decode_launch(q.dtype, head_dim, q.device)
    meta = dict(
        GROUP=group, HEAD_DIM=head_dim, PAGE=page, BLOCK_H=max(16, next_pow2(group)),
        BLOCK_D=block_d, BLOCK_N=launch.block_n,
        DIRECT=splits == 1, PRECISION=dot_precision(q.dtype), DOT=dot_dtype(q.dtype),
        QUANT=kv_layer.dtype in QUANTIZED_CACHE,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    if splits == 1:
        # lse is never written; a real (1-element) buffer keeps the launcher's pointer check happy.
        partial, lse = out.unsqueeze(2), out.new_empty(1, dtype=torch.float32)
        lse_strides = (0, 0)
    else:
        if partial is None or lse is None:
            partial = q.new_empty(batch, num_heads, splits, head_dim, dtype=torch.float32)
            lse = q.new_empty(batch, num_heads, splits, dtype=torch.float32)
        check_tensor("partial", partial, 4, (torch.float32,), q.device)
        check_shape("partial", partial, (batch, num_heads, splits, head_dim))
        check_tensor("lse", lse, 3, (torch.float32,), q.device)
        check_shape("lse", lse, (batch, num_heads, splits))
        lse_strides = (lse.stride(0), lse.stride(1))
    _decode_split_kernel[(batch, num_kv_heads, splits)](
        q, kv_layer, block_tables, seq_lens, partial, lse,
        scale, splits,
        q.stride(0), q.stride(1),
        kv_layer.stride(0), kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3),
        block_tables.stride(0),
        partial.stride(0), partial.stride(1), partial.stride(2),
        *lse_strides,
        **meta,
    )  # fmt: skip
    if splits > 1:
        _decode_reduce_kernel[(batch, num_heads)](
            partial, lse, out, seq_lens, splits,
            partial.stride(0), partial.stride(1), partial.stride(2),
            lse.stride(0), lse.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=next_pow2(splits),
        )  # fmt: skip
    return out


def paged_decode_attention_ref(
    q: torch.Tensor,
    kv_layer: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The same contract in plain torch, one sequence at a time, in float32."""
    out = torch.empty_like(q)
    page = kv_layer.shape[2]
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        if n == 0:
            continue
        blocks = block_tables[b, : -(-n // page)].long()
        k = cached_values(kv_layer[blocks, 0].flatten(0, 1)[:n])  # [n, Hk, D]
        v = cached_values(kv_layer[blocks, 1].flatten(0, 1)[:n])
        o = F.scaled_dot_product_attention(
            q[b].float().unsqueeze(1),  # [Hq, 1, D]
            k.transpose(0, 1),
            v.transpose(0, 1),
            scale=scale,
            enable_gqa=True,
        )
        out[b] = o.squeeze(1).to(q.dtype)
    return out
