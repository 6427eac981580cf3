"""Reshape-and-cache: store each new token's K and V in its paged-cache slot.

    token t  ->  kv_layer[slot_blocks[t], 0, slot_offsets[t]] = k[t]   ([Hk, D])
                 kv_layer[slot_blocks[t], 1, slot_offsets[t]] = v[t]

One program per token; a negative block id marks a padding token that is skipped (so a
caller may pad a batch to a captured size without writing anywhere).

Into a quantized cache (int8 / fp8: engine/kv_cache/quant.py) each (token, head) row is
quantized here, with the same arithmetic as that module's `quantize` (a float16 scale from
the row's largest magnitude, an IEEE division, round half to even for int8), so both write
the same bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    QUANTIZED_CACHE,
    check,
    check_kv_layer,
    check_shape,
    check_tensor,
    next_pow2,
)
from engine.kv_cache.quant import quantize


@triton.jit
def _reshape_and_cache_kernel(
    k_ptr, v_ptr, kv_ptr, blocks_ptr, offsets_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kvb, stride_kvkv, stride_kvs, stride_kvh,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QMAX: tl.constexpr,
    ROUND: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    block = tl.load(blocks_ptr + t).to(tl.int64)
    if block >= 0:
        offset = tl.load(offsets_ptr + t)
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        h_mask = h < NUM_KV_HEADS
        mask = h_mask[:, None] & (d < HEAD_DIM)[None, :]
        row = kv_ptr + block * stride_kvb + offset * stride_kvs + h * stride_kvh  # [BLOCK_H]
        dst = row[:, None] + d[None, :]
        k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
        v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
        if QMAX > 0:
            _store_quantized(k, dst, row + HEAD_DIM, mask, h_mask, QMAX, ROUND)
            _store_quantized(v, dst + stride_kvkv, row + stride_kvkv + HEAD_DIM, mask, h_mask,
                             QMAX, ROUND)  # fmt: skip
        else:
            tl.store(dst, k, mask=mask)
            tl.store(dst + stride_kvkv, v, mask=mask)


@triton.jit
def _store_quantized(x, dst, scale_dst, mask, h_mask, QMAX: tl.constexpr, ROUND: tl.constexpr):
    """Rows x [BLOCK_H, BLOCK_D] -> their quantized values at dst, a float16 scale per row at
    scale_dst (byte pointers [BLOCK_H])."""
    xf = x.to(tl.float32)
    scale = _row_scale(tl.max(tl.where(mask, tl.abs(xf), 0.0), 1), QMAX)
    tl.store(dst, _quantized(xf, scale, QMAX, ROUND).to(dst.dtype.element_ty), mask=mask)
    tl.store(scale_dst.to(tl.pointer_type(tl.float16)), scale, mask=h_mask)


@triton.jit
def _store_quantized_pairs(
    xa, xb, dst_a, dst_b, scale_dst, mask, h_mask, QMAX: tl.constexpr, ROUND: tl.constexpr
):  # fmt: skip
    """`_store_quantized` for rows held as two halves (a rotary kernel's pairs): the scale
    from the largest magnitude of both."""
    xa, xb = xa.to(tl.float32), xb.to(tl.float32)
    amax_a = tl.max(tl.where(mask, tl.abs(xa), 0.0), 1)
    scale = _row_scale(tl.maximum(amax_a, tl.max(tl.where(mask, tl.abs(xb), 0.0), 1)), QMAX)
    tl.store(dst_a, _quantized(xa, scale, QMAX, ROUND).to(dst_a.dtype.element_ty), mask=mask)
    tl.store(dst_b, _quantized(xb, scale, QMAX, ROUND).to(dst_b.dtype.element_ty), mask=mask)
    tl.store(scale_dst.to(tl.pointer_type(tl.float16)), scale, mask=h_mask)


@triton.jit
def _row_scale(amax, QMAX: tl.constexpr):
    """A row's float16 scale from its largest magnitude (never below 2^-14)."""
    return tl.maximum(tl.math.div_rn(amax, QMAX), 2.0**-14).to(tl.float16)


@triton.jit
def _quantized(xf, scale, QMAX: tl.constexpr, ROUND: tl.constexpr):
    """Rows xf (float32) over their scales, rounded (int8: half to even, as torch.round) and
    clamped to +-QMAX; float32."""
    y = tl.math.div_rn(xf, scale.to(tl.float32)[:, None])
    if ROUND:
        r = tl.floor(y + 0.5)
        y = tl.where((r - y == 0.5) & (r - 2.0 * tl.floor(r * 0.5) != 0.0), r - 1.0, r)
    return tl.minimum(tl.maximum(y, -QMAX), QMAX)


def reshape_and_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layer: torch.Tensor,
    slot_blocks: torch.Tensor,
    slot_offsets: torch.Tensor,
) -> None:
    """k, v: [T, Hk, D]; kv_layer: [num_blocks, 2, block_size, Hk, E] (mutated; E = D, or
    D + 2 for a quantized cache);
    slot_blocks, slot_offsets: [T]. Slots must be distinct (no two tokens share one), but
    for a slot whose content matters to nobody, such as the scratch slot every padding row
    of a replayed decode step writes: which of those tokens lands there is undefined."""
    check_cache_write(k, v, kv_layer, slot_blocks, slot_offsets)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _reshape_and_cache_kernel[(num_tokens,)](
        k, v, kv_layer, slot_blocks, slot_offsets,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        kv_layer.stride(0), kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=next_pow2(num_kv_heads), BLOCK_D=next_pow2(head_dim),
        QMAX=QUANTIZED_CACHE.get(kv_layer.dtype, 0.0), ROUND=kv_layer.dtype == torch.int8,
    )  # fmt: skip


def check_cache_write(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layer: torch.Tensor,
    slot_blocks: torch.Tensor,
    slot_offsets: torch.Tensor,
) -> None:
    """reshape_and_cache's argument checks (rotary_cache.py's too)."""
    check_tensor("k", k, 3, FLOAT_DTYPES)
    check_tensor("v", v, 3, (k.dtype,), k.device)
    check_tensor("slot_blocks", slot_blocks, 1, INDEX_DTYPES, k.device)
    check_tensor("slot_offsets", slot_offsets, 1, INDEX_DTYPES, k.device)
    num_tokens, num_kv_heads, head_dim = k.shape
    check_shape("v", v, k.shape)
    check_shape("slot_blocks", slot_blocks, (num_tokens,))
    check_shape("slot_offsets", slot_offsets, (num_tokens,))
    _, cache_heads, cache_dim = check_kv_layer(kv_layer, k.dtype, k.device)
    check(
        (cache_heads, cache_dim) == (num_kv_heads, head_dim),
        f"k has {num_kv_heads} heads of {head_dim}; the cache holds {cache_heads} of {cache_dim}",
    )


def reshape_and_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layer: torch.Tensor,
    slot_blocks: torch.Tensor,
    slot_offsets: torch.Tensor,
) -> None:
    keep = slot_blocks >= 0
    blocks, offsets = slot_blocks[keep].long(), slot_offsets[keep].long()
    k, v = k[keep], v[keep]
    if kv_layer.dtype in QUANTIZED_CACHE:
        k, v = quantize(k, kv_layer.dtype), quantize(v, kv_layer.dtype)
    kv_layer[blocks, 0, offsets] = k
    kv_layer[blocks, 1, offsets] = v
