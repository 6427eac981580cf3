"""Paged attention in plain torch: the CPU path, and the reference the Triton kernels are
tested against.

Decode: gather each sequence's blocks into a padded [B, max_blocks * block_size] context, mask
positions past its length, one batched SDPA call. Prefill/extend: one SDPA call per chunk;
a chunk without a cached prefix attends to its own fresh K/V (no gather), otherwise to its
context gathered from the cache under a bottom-right-aligned causal mask.

A quantized cache (int8 / fp8 entries with their scales: engine/kv_cache/quant.py) is
written quantized and dequantized as it is gathered; a chunk without a cached prefix still
attends to its own unquantized K/V (the Triton kernels read every chunk from the cache, so on
a quantized cache the two paths differ by the quantization's rounding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend, AttentionMetadata, PrefillChunk, Tensor
from engine.kv_cache import quant as kv_quant


def _decode_mask(meta: AttentionMetadata) -> torch.Tensor:
    mask = meta.backend_state.get("decode_mask")
    if mask is None:
        max_len = meta.decode_block_tables.shape[1] * meta.block_size
        positions = torch.arange(max_len, device=meta.decode_seq_lens.device)
        mask = (positions[None, :] < meta.decode_seq_lens[:, None])[:, None, None, :]
        meta.backend_state["decode_mask"] = mask
    return mask


def gather_blocks(
    kv_layer: torch.Tensor, block_ids: torch.Tensor, which: int, dtype: torch.dtype
) -> torch.Tensor:
    """[..., n_blocks] block ids -> [..., n_blocks * block_size, Hk, D] in `dtype` (a copy).

    index_select on the K (or V) view rather than `kv_layer[block_ids, which]`: one copy
    instead of advanced indexing's (64 blocks of 16 x 4 x 64 bfloat16: 21 us for K and V
    against 117)."""
    g = kv_layer[:, which].index_select(0, block_ids.flatten())
    g = g.view(*block_ids.shape, *g.shape[1:]).flatten(-4, -3)
    return kv_quant.dequantize(g, dtype) if kv_quant.is_quantized(kv_layer) else g.to(dtype)


class TorchPagedAttention(AttentionBackend):
    name = "torch"

    def write_kv(self, k: Tensor, v: Tensor, kv_layer: Tensor, meta: AttentionMetadata) -> None:
        if kv_quant.is_quantized(kv_layer):
            k, v = kv_quant.quantize(k, kv_layer.dtype), kv_quant.quantize(v, kv_layer.dtype)
        kv_layer[meta.slot_blocks, 0, meta.slot_offsets] = k
        kv_layer[meta.slot_blocks, 1, meta.slot_offsets] = v

    def decode_into(
        self, out: Tensor, q: Tensor, kv_layer: Tensor, meta: AttentionMetadata, scale: float
    ) -> None:
        out[:] = self._decode(q, kv_layer, meta, scale)

    def prefill_into(
        self, out: Tensor, q: Tensor, k: Tensor, v: Tensor, kv: Tensor, meta: AttentionMetadata,
        scale: float,
    ) -> None:  # fmt: skip
        self._chunks_into(out, q, k, v, kv, meta.prefills, scale)

    def _chunks_into(
        self, out: Tensor, q: Tensor, k: Tensor, v: Tensor, kv: Tensor,
        chunks: Sequence[PrefillChunk], scale: float,
    ) -> None:  # fmt: skip
        for c in chunks:
            rows = slice(c.query_start, c.query_start + c.query_len)
            if c.seq_len == c.query_len:
                out[rows] = _sdpa(q[rows], k[rows], v[rows], None, scale, causal=True)
                continue
            keys = gather_blocks(kv, c.block_ids, 0, q.dtype)[: c.seq_len]
            values = gather_blocks(kv, c.block_ids, 1, q.dtype)[: c.seq_len]
            q_pos = torch.arange(c.query_len, device=q.device) + (c.seq_len - c.query_len)
            mask = torch.arange(c.seq_len, device=q.device)[None, :] <= q_pos[:, None]
            out[rows] = _sdpa(q[rows], keys, values, mask, scale, causal=False)

    def _decode(
        self, q: torch.Tensor, kv_layer: torch.Tensor, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        keys = gather_blocks(kv_layer, meta.decode_block_tables, 0, q.dtype)  # [B, L, Hk, D]
        values = gather_blocks(kv_layer, meta.decode_block_tables, 1, q.dtype)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # [B, Hq, 1, D]
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=_decode_mask(meta),
            scale=scale,
            enable_gqa=True,
        )
        return out.squeeze(2)


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """q: [Tq, Hq, D], k/v: [Tk, Hk, D] -> [Tq, Hq, D]."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask,
        is_causal=causal,
        scale=scale,
        enable_gqa=True,
    )
    return out.squeeze(0).transpose(0, 1)
