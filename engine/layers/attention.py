"""Multi-head self-attention over the paged cache: QKV projection, optional per-head q/k
RMSNorm (Qwen3), rotary, the backend call, output projection."""

from __future__ import annotations

import torch
from torch import nn

from engine.attention.backend import AttentionBackend, AttentionMetadata, Rotation
from engine.layers.linear import QKVParallelLinear, RowParallelLinear
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.parallel import SINGLE, TPGroup


class SelfAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qkv_bias: bool,
        qk_norm_eps: float | None,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TPGroup = SINGLE,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            hidden_size, head_dim, num_heads, num_kv_heads, qkv_bias, tp, dtype
        )
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, False, tp, dtype)
        self.head_dim = head_dim
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.scale = head_dim**-0.5
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, dtype)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, dtype)
        self.rotary = rotary
        self.backend = backend

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q_size, kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm.norm_only(q)
            k = self.k_norm.norm_only(k)
        if self.backend.fuses_rotary:  # rotated as the backend writes K/V: one kernel
            rotation = Rotation(positions, self.rotary.cos, self.rotary.sin)
            out = self.backend.forward(q, k, v, kv_layer, meta, self.scale, rotation)
        else:
            q, k = self.rotary(positions, q, k)
            out = self.backend.forward(q, k, v, kv_layer, meta, self.scale)
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))
