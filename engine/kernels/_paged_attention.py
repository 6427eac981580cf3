"""What the decode and prefill attention kernels share: the loop over one sequence's K/V in
the paged cache (online softmax), and the host-side checks of q, the cache layer and out.

    keys [start, end) of a sequence, BLOCK_N at a time:
        position p -> cache block table[p // PAGE], slot p % PAGE, this program's KV head
        s = q K^T * scale (masked)  ->  m, denom, acc rescaled by exp(m_old - m_new)

`attend_paged_kv` is a `@triton.jit` function, inlined into each kernel: the kernels compile
to the same code as when each carried its own copy of the loop.

A quantized cache (QUANT: int8 or fp8 entries, each followed by its float16 scale; see
engine/kv_cache/quant.py) is read as it is stored: the values widen to the dot's type,
a K entry's scale multiplies its scores and a V entry's its probabilities (one multiply per
key, not per value).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import (
    FLOAT_DTYPES,
    QUANTIZED_CACHE,
    check,
    check_kv_layer,
    check_shape,
    check_tensor,
)
from engine.kv_cache.quant import dequantize


@triton.jit
def attend_paged_kv(
    m, denom, acc, q, q_pos, kv_ptr, table_ptr, table_row, kv_head, start, end, scale,
    stride_tb, stride_kvb, stride_kvkv, stride_kvs, stride_kvh,
    ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr,
    QUANT: tl.constexpr,
):  # fmt: skip
    """q: [ROWS, BLOCK_D] against keys [start, end) of the sequence whose block table is
    row `table_row` of `table_ptr`. CAUSAL: row r sees only keys at positions <= q_pos[r]
    (q_pos is unused otherwise). Carries on the online-softmax state (m, denom, acc) -- the
    row maximum, the sum of exp(s - m) and the unnormalised output [ROWS, BLOCK_D], in
    float32; `initial_state` starts one -- and returns it."""
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_mask = pos < end
        block = tl.load(table_ptr + table_row * stride_tb + pos // PAGE, mask=n_mask, other=0)
        base = block.to(tl.int64) * stride_kvb + (pos % PAGE) * stride_kvs + kv_head * stride_kvh
        k = tl.load(
            kv_ptr + base[None, :] + d[:, None], mask=n_mask[None, :] & d_mask[:, None], other=0.0
        )
        s = tl.dot(q.to(DOT), k.to(DOT), input_precision=PRECISION) * scale
        if QUANT:
            k_scale = tl.load(_scale_ptr(kv_ptr + base + HEAD_DIM), mask=n_mask, other=0.0)
            s = s * k_scale.to(tl.float32)[None, :]
        if CAUSAL:
            # Callers start a causal range at a key every row sees, so each row's maximum is
            # finite from the first tile.
            s = tl.where((pos[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
        else:
            s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        v = tl.load(
            kv_ptr + stride_kvkv + base[:, None] + d[None, :],
            mask=n_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        if QUANT:
            v_scale = tl.load(
                _scale_ptr(kv_ptr + stride_kvkv + base + HEAD_DIM), mask=n_mask, other=0.0
            )
            p = p * v_scale.to(tl.float32)[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v.to(DOT), input_precision=PRECISION)
        m = m_new
    return m, denom, acc


@triton.jit
def initial_state(ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """(m, denom, acc) before any key: -inf, 0, 0."""
    m = tl.full([ROWS], float("-inf"), tl.float32)
    return m, tl.zeros([ROWS], tl.float32), tl.zeros([ROWS, BLOCK_D], tl.float32)


@triton.jit
def _scale_ptr(byte_ptr):
    """The float16 scale stored at `byte_ptr` (after an entry's 1-byte values)."""
    return byte_ptr.to(tl.pointer_type(tl.float16))


def cached_values(entries: torch.Tensor) -> torch.Tensor:
    """Cache entries [..., E] as float32 values [..., D] (the references' reading of a cache)."""
    if entries.dtype in QUANTIZED_CACHE:
        return dequantize(entries, torch.float32)
    return entries.float()


def check_paged_attention(
    q: torch.Tensor, kv_layer: torch.Tensor, out: torch.Tensor | None
) -> tuple[torch.Tensor, int, int]:
    """q: [T, Hq, D] against one cache layer [num_blocks, 2, page, Hk, D] and `out` (made like
    q when None). Returns (out, page, Hk)."""
    check_tensor("q", q, 3, FLOAT_DTYPES)
    page, num_kv_heads, kv_dim = check_kv_layer(kv_layer, q.dtype, q.device)
    _, num_heads, head_dim = q.shape
    check(kv_dim == head_dim, f"head_dim of q ({head_dim}) and kv_layer ({kv_dim}) differ")
    check(
        num_heads % num_kv_heads == 0, f"{num_heads} query heads not a multiple of {num_kv_heads}"
    )
    if out is None:
        out = torch.empty_like(q)
    check_tensor("out", out, 3, (q.dtype,), q.device)
    check_shape("out", out, q.shape)
    return out, page, num_kv_heads
