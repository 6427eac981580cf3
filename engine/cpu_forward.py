"""The model's forward on CPU without the modules' per-layer Python: the CPU's counterpart of
engine/cuda_graphs.py.

A decode step runs nine kernels a layer, each a few tens of microseconds at decode sizes;
between them the modules' Python (module calls, each layer's checks of dtypes, strides and
environment flags, which GEMM kernel takes how many rows, the attention backend's choices)
runs on one core while the other waits in OpenMP's barrier. On a decode step of 16 rows (the
125M preset, bfloat16, 2 threads) the same kernels called from one flat loop take 4-10 ms of
36-48 less.

`CPUForward` resolves those choices once when the model loads (which kernels, which
weights) and once a step (which GEMM kernel for the step's row count, how decode rows
attend), then runs the layers as a flat sequence of kernel calls: the kernels the modules
would call, on the same tensors, in the same order, so its hidden states are the modules',
bit for bit (tests/engine/test_cpu_forward.py). A step with prompt chunks hands each layer's
attention to the backend's `forward`, as the modules do, and calls the per-layer KV hook
after each layer. The engine's model runner and a draft model (engine/spec/draft_model.py)
both run their steps through it.

Built only for a model whose every layer has a plain kernel path: CPU, float32 or bfloat16,
one TP rank, no INT8 weights, a KV cache of the model's dtype, the CPU attention backend with
its kernels; any other model runs its modules. BATON_CPU_FORWARD=0 runs the modules (to
bisect a mismatch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core import env
from engine.attention.backend import AttentionMetadata
from engine.attention.cpu_paged import CPUPagedAttention
from engine.device import cpu_fused_ops
from engine.layers import cpu_gemm
from engine.layers.activation import silu_and_mul
from engine.layers.norm import RMSNorm


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's tensors, as its modules hold them."""

    input_norm: torch.Tensor
    input_eps: float
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    post_eps: float
    gate_up: torch.Tensor
    down: torch.Tensor


class CPUForward:
    def __init__(self, model: nn.Module, kv_cache: torch.Tensor, fused: Any) -> None:
        """Use `build`, which checks that this can run the model."""
        inner = model.model
        attn = inner.layers[0].self_attn
        self.embed = inner.embed_tokens
        self.final_norm, self.final_eps = inner.norm.weight, inner.norm.eps
        self.kv_cache = kv_cache
        self.fused = fused
        self.backend: CPUPagedAttention = attn.backend
        self.write_kv = attn.backend.kernel.write_kv
        self.cos, self.sin = attn.rotary.cos, attn.rotary.sin
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.scale = attn.scale
        self.split = [attn.qkv_proj.q_size, attn.qkv_proj.kv_size, attn.qkv_proj.kv_size]
        self.layers = [_layer(layer) for layer in inner.layers]
        self.steps = 0
        """Steps run through it (the tests read it to know the flat path ran)."""

    @classmethod
    def build(cls, model: nn.Module, kv_cache: torch.Tensor) -> CPUForward | None:
        """A flat forward of `model` over `kv_cache`, or None where some part of the model has
        no plain kernel path here (see the module's docstring)."""
        if not env.CPU_FORWARD.get() or kv_cache.device.type != "cpu":
            return None
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if not layers:
            return None
        dtype = inner.norm.weight.dtype
        fused = cpu_fused_ops(torch.empty(1, 1, dtype=dtype))
        if fused is None or kv_cache.dtype != dtype or not kv_cache.is_contiguous():
            return None
        for layer in layers:
            attn = layer.self_attn
            backend = attn.backend
            if not isinstance(backend, CPUPagedAttention) or backend.kernel is None:
                return None
            if attn.rotary.cos.dtype != dtype:
                return None
            linears = (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            for linear in linears:
                plain = linear.use_cpu_gemm and linear.weight_scale is None
                if not plain or linear.tp.size != 1 or linear.weight.dtype != dtype:
                    return None
            if layer.mlp.gate_up_proj.bias is not None or layer.mlp.down_proj.bias is not None:
                return None
        return cls(model, kv_cache, fused)

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The step's final hidden states [tokens, hidden], as `LlamaModel.forward` gives
        them (and its side effects: the step's K/V written, the KV hook called per layer)."""
        rows, fused, first = input_ids.shape[0], self.fused, self.layers[0]
        # Every layer has the same shapes: the modules' choices for this row count, once.
        qkv_gemm = cpu_gemm.kernel_for(rows, first.qkv) or F.linear
        o_gemm = cpu_gemm.kernel_for(rows, first.o) or F.linear
        down_gemm = cpu_gemm.kernel_for(rows, first.down) or F.linear
        silu_gemm = cpu_gemm.silu_mul_kernel_for(rows, first.gate_up)
        gate_up_gemm = cpu_gemm.kernel_for(rows, first.gate_up) or F.linear
        attend = self._decode_kernel(meta)
        hidden = self.embed(input_ids)
        residual = None
        for i, layer in enumerate(self.layers):
            if residual is None:
                h, residual = fused.rms_norm(hidden, layer.input_norm, layer.input_eps), hidden
            else:
                h, residual = fused.add_rms_norm(
                    hidden, residual, layer.input_norm, layer.input_eps
                )
            q, k, v = qkv_gemm(h, layer.qkv, layer.qkv_bias).split(self.split, dim=-1)
            q = q.view(rows, self.heads, self.head_dim)
            k = k.view(rows, self.kv_heads, self.head_dim)
            v = v.view(rows, self.kv_heads, self.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = layer.q_norm.norm_only(q), layer.k_norm.norm_only(k)
            q, k = fused.rotary(positions, q, k, self.cos, self.sin)
            out = self._attention(q, k, v, self.kv_cache[i], meta, attend)
            o = o_gemm(out.view(rows, self.heads * self.head_dim), layer.o, layer.o_bias)
            h, residual = fused.add_rms_norm(o, residual, layer.post_norm, layer.post_eps)
            if silu_gemm is not None:
                gated = silu_gemm(h, layer.gate_up)
            else:
                gated = silu_and_mul(gate_up_gemm(h, layer.gate_up, None))
            hidden = down_gemm(gated, layer.down, None)
            if meta.layer_done is not None:
                meta.layer_done(i)
        self.steps += 1
        return fused.add_rms_norm(hidden, residual, self.final_norm, self.final_eps)[0]

    def _decode_kernel(self, meta: AttentionMetadata) -> Any | None:
        """The kernel a decode-only step's rows attend with in every layer (the tables and
        shapes are every layer's), or None where the backend does more than call it."""
        if meta.prefills or not meta.num_decodes:
            return None
        dtype = self.layers[0].qkv.dtype
        shape = torch.empty(meta.num_decodes, self.heads, self.head_dim, dtype=dtype, device="meta")
        return self.backend.step_decode_kernel(shape, self.kv_cache[0], meta)

    def _attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
        decode_kernel: Any | None,
    ) -> torch.Tensor:
        """`backend.forward`, its decode-only case without its per-layer choices."""
        if decode_kernel is None:
            return self.backend.forward(q, k, v, kv_layer, meta, self.scale)
        start = time.perf_counter()
        self.write_kv(k, v, kv_layer, meta.slot_blocks, meta.slot_offsets)
        out = torch.empty_like(q)
        decode_kernel(q, kv_layer, meta.decode_block_tables, meta.decode_seq_lens, self.scale, out)
        if meta.totals is not None:
            meta.totals.attention_s += time.perf_counter() - start
        return out


def _layer(layer: nn.Module) -> _Layer:
    attn, mlp = layer.self_attn, layer.mlp
    return _Layer(
        input_norm=layer.input_layernorm.weight,
        input_eps=layer.input_layernorm.eps,
        qkv=attn.qkv_proj.weight,
        qkv_bias=attn.qkv_proj.bias,
        q_norm=attn.q_norm,
        k_norm=attn.k_norm,
        o=attn.o_proj.weight,
        o_bias=attn.o_proj.bias,
        post_norm=layer.post_attention_layernorm.weight,
        post_eps=layer.post_attention_layernorm.eps,
        gate_up=mlp.gate_up_proj.weight,
        down=mlp.down_proj.weight,
    )
