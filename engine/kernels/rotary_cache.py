"""Rotary embedding and the KV cache write in one kernel: rotate a step's q and k in place
(rotary.py) and store the rotated k and the v in their cache slots (reshape_and_cache.py).

A layer of a step otherwise launches the two one after the other, each one program per
token reading the same k; in a decode step of a large model each is a few microseconds of
launch and latency with almost nothing to do, 32 layers deep. Here each program rotates its
token's heads, keeps the rotated keys in registers and writes them, with the values, to
the token's slot: one launch, k read once. Bit for bit what the two kernels write: the keys
are rounded to k's dtype before they are stored or quantized, as the second kernel reads
them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import QUANTIZED_CACHE, next_pow2
from engine.kernels.reshape_and_cache import (
    _store_quantized,
    _store_quantized_pairs,
    check_cache_write,
    reshape_and_cache_ref,
)
from engine.kernels.rotary import (
    _cos_sin,
    _pair_offsets,
    _rotate_heads,
    apply_rotary_ref,
    check_rotary,
)


@triton.jit
def _rotary_cache_kernel(
    q_ptr, k_ptr, v_ptr, kv_ptr, cos_ptr, sin_ptr, positions_ptr, blocks_ptr, offsets_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_table,
    stride_kvb, stride_kvkv, stride_kvs, stride_kvh,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr, NEOX: tl.constexpr, QMAX: tl.constexpr, ROUND: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(cos_ptr, sin_ptr, positions_ptr, t, stride_table, HALF, BLOCK_HALF)
    _rotate_heads(q_ptr, stride_qt, stride_qh, t, cos, sin, NUM_Q_HEADS, HALF, BLOCK_QH,
                  BLOCK_HALF, NEOX)  # fmt: skip
    ka, kb, pair_mask = _rotate_heads(k_ptr, stride_kt, stride_kh, t, cos, sin, NUM_KV_HEADS,
                                      HALF, BLOCK_H, BLOCK_HALF, NEOX)  # fmt: skip
    block = tl.load(blocks_ptr + t).to(tl.int64)
    if block >= 0:  # a padding token (negative block) is rotated but stored nowhere
        offset = tl.load(offsets_ptr + t)
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        h_mask = h < NUM_KV_HEADS
        mask = h_mask[:, None] & (d < HEAD_DIM)[None, :]
        a_off, b_off = _pair_offsets(HALF, BLOCK_HALF, NEOX)
        row = kv_ptr + block * stride_kvb + offset * stride_kvs + h * stride_kvh  # [BLOCK_H]
        v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
        v_dst = row[:, None] + stride_kvkv + d[None, :]
        if QMAX > 0:
            _store_quantized_pairs(ka, kb, row[:, None] + a_off[None, :],
                                   row[:, None] + b_off[None, :], row + HEAD_DIM, pair_mask,
                                   h_mask, QMAX, ROUND)  # fmt: skip
            _store_quantized(v, v_dst, row + stride_kvkv + HEAD_DIM, mask, h_mask, QMAX, ROUND)
        else:
            tl.store(row[:, None] + a_off[None, :], ka, mask=pair_mask)
            tl.store(row[:, None] + b_off[None, :], kb, mask=pair_mask)
            tl.store(v_dst, v, mask=mask)


def rotary_and_cache(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_layer: torch.Tensor,
    slot_blocks: torch.Tensor,
    slot_offsets: torch.Tensor,
    neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`apply_rotary(positions, q, k, cos, sin, neox)` then `reshape_and_cache(k, v,
    kv_layer, slot_blocks, slot_offsets)`, with their arguments and checks, in one launch:
    q and k rotated in place (and returned), the cache mutated."""
    check_rotary(positions, q, k, cos, sin)
    check_cache_write(k, v, kv_layer, slot_blocks, slot_offsets)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if num_tokens == 0:
        return q, k
    _rotary_cache_kernel[(num_tokens,)](
        q, k, v, kv_layer, cos, sin, positions, slot_blocks, slot_offsets,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0),
        kv_layer.stride(0), kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3),
        NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HALF=head_dim // 2, BLOCK_QH=next_pow2(num_q_heads), BLOCK_H=next_pow2(num_kv_heads),
        BLOCK_HALF=next_pow2(head_dim // 2), BLOCK_D=next_pow2(head_dim), NEOX=neox,
        QMAX=QUANTIZED_CACHE.get(kv_layer.dtype, 0.0), ROUND=kv_layer.dtype == torch.int8,
    )  # fmt: skip
    return q, k


def rotary_and_cache_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_layer: torch.Tensor,
    slot_blocks: torch.Tensor,
    slot_offsets: torch.Tensor,
    neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two references one after the other: (rotated q, rotated k), the cache mutated."""
    q, k = apply_rotary_ref(positions, q, k, cos, sin, neox)
    reshape_and_cache_ref(k, v, kv_layer, slot_blocks, slot_offsets)
    return q, k
