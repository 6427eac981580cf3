"""The CPU attention backend: the torch paged path, with decode served by a small C++ kernel
(`engine/cpu_kernels/paged_decode.cpp`, float32 and bfloat16 caches) that reads K/V straight
from the paged cache; an int8
cache (engine/kv_cache/quant.py) has its own kernels (`kv_int8.cpp`): decode that widens
the int8 values in registers instead of dequantizing a copy, and a one-pass quantizing write.
On CPUs with AMX a bfloat16 model's decode scores are tile products (`paged_decode_amx.cpp`),
rows or prompt chunks that share cached blocks attend them once together
(engine/attention/cascade.py), and a prompt chunk after cached context attends it causally
straight from the cache (`shared_attention_amx.cpp`).

Why our own kernel: on CPU the torch path must gather every sequence's blocks into a padded
copy before attention (reading the cache twice and writing it once per layer per step);
PyTorch has no paged attention for CPU and Triton has no CPU backend. If the kernel cannot
be built here, the engine falls back to the plain torch backend and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine import cpu_kernels
from engine.attention import cascade
from engine.attention.backend import AttentionMetadata, PrefillChunk, Tensor
from engine.attention.torch_paged import TorchPagedAttention


def load_kernel() -> Any | None:
    return cpu_kernels.load("paged_decode")


class CPUPagedAttention(TorchPagedAttention):
    name = "cpu"

    def __init__(self) -> None:
        self.kernel = load_kernel()

    def decode_into(
        self, out: Tensor, q: Tensor, kv_layer: Tensor, meta: AttentionMetadata, scale: float
    ) -> None:
        """The kernel reads a bfloat16 model's queries and writes its output in place (it
        widens and rounds a sequence at a time); only rows whose groups merge a shared part
        (cascade) are computed in float32 first, the merge's precision."""
        kernel = self._decode_kernel(q, kv_layer)
        usable = q.dtype in _PLAIN and out.dtype == q.dtype and out.is_contiguous()
        if kernel is None or not usable or not kv_layer.is_contiguous():
            out.copy_(super()._decode(q, kv_layer, meta, scale))  # fp8 caches too
            return
        q = q.contiguous()
        prefix = None
        if kv_layer.dtype in _PLAIN:
            amx = cascade.amx_kernel(q, kv_layer) is not None
            prefix = cascade.shared_prefix(meta, amx=amx)
        if prefix is None:
            kernel(q, kv_layer, meta.decode_block_tables, meta.decode_seq_lens, scale, out)
            return
        wide = torch.empty(q.shape, dtype=torch.float32)
        lse = torch.empty(q.shape[:2], dtype=torch.float32)
        kernel(q, kv_layer, prefix.tail_tables, prefix.tail_lens, scale, wide, lse)
        out.copy_(cascade.merge_groups_into(wide, lse, q, kv_layer, prefix, scale))

    def step_decode_kernel(
        self, q: Tensor, kv_layer: Tensor, meta: AttentionMetadata
    ) -> Callable[..., None] | None:
        """The kernel `decode_into` calls straight for this step's decode rows, `q` and the
        cache shaped as every layer of the step has them: (q, kv_layer, block_tables, seq_lens,
        scale, out) -> None, out contiguous and q's dtype; None where it does more (a cascade
        merge, the torch path). For engine/cpu_forward.py, which decides once a step."""
        kernel = self._decode_kernel(q, kv_layer)
        if kernel is None or q.dtype not in _PLAIN or not kv_layer.is_contiguous():
            return None
        if kv_layer.dtype in _PLAIN:
            amx = cascade.amx_kernel(q, kv_layer) is not None
            if cascade.shared_prefix(meta, amx=amx) is not None:
                return None
        return kernel

    def _decode_kernel(self, q: Tensor, kv_layer: Tensor) -> Callable[..., None] | None:
        kernel = self._kernel_for(kv_layer.dtype)
        if kernel is not None and q.dtype == torch.bfloat16 and _amx_shapes(q, kv_layer):
            kernel = _amx_kernel() or kernel
        return kernel

    def _decode(
        self, q: torch.Tensor, kv_layer: torch.Tensor, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        self.decode_into(out, q, kv_layer, meta, scale)
        return out

    def prefill_into(
        self, out: Tensor, q: Tensor, k: Tensor, v: Tensor, kv: Tensor, meta: AttentionMetadata,
        scale: float,
    ) -> None:  # fmt: skip
        groups = cascade.shared_chunks(meta) if kv.dtype in _PLAIN else []
        if not groups:
            return super().prefill_into(out, q, k, v, kv, meta, scale)
        for group in groups:
            cascade.chunk_group_into(out, q, k, v, kv, group, meta.block_size, scale)
        grouped = {id(c) for group in groups for c in group.chunks}
        rest = [c for c in meta.prefills if id(c) not in grouped]
        self._chunks_into(out, q, k, v, kv, rest, scale)

    def _chunks_into(
        self, out: Tensor, q: Tensor, k: Tensor, v: Tensor, kv: Tensor,
        chunks: Sequence[PrefillChunk], scale: float,
    ) -> None:  # fmt: skip
        """On AMX a chunk with cached context (up to `cascade.AMX_MAX_QUERIES` tokens) attends
        it and itself straight from the cache, causally (its K / V are written first): no
        gather of the context, no mask. One layer, bf16, 64 new tokens on 1,024 cached 0.64 ->
        0.34 ms with the cache hot, 0.87 -> 0.41 cold. A chunk without context stays on
        torch's causal flash attention over its own K / V, faster while they are hot, as a
        prefill has them (256 tokens: 0.37 ms against the kernel's 0.47)."""
        kernel = cascade.amx_kernel(q, kv, rows=1)
        if kernel is None:
            return super()._chunks_into(out, q, k, v, kv, chunks, scale)
        rest = []
        for c in chunks:
            if c.seq_len == c.query_len or c.query_len > cascade.AMX_MAX_QUERIES:
                rest.append(c)
                continue
            rows = slice(c.query_start, c.query_start + c.query_len)
            part = torch.empty((c.query_len, *q.shape[1:]), dtype=torch.float32)
            lse = torch.empty(part.shape[:2], dtype=torch.float32)
            last = torch.arange(c.seq_len - c.query_len, c.seq_len)
            blocks = c.block_ids.to(torch.long).contiguous()
            kernel(q[rows].contiguous(), kv, blocks, scale, part, lse, None,
                   False, last)  # fmt: skip
            out[rows] = part
        super()._chunks_into(out, q, k, v, kv, rest, scale)

    def write_kv(self, k: Tensor, v: Tensor, kv_layer: Tensor, meta: AttentionMetadata) -> None:
        slots = (meta.slot_blocks, meta.slot_offsets)
        if kv_layer.is_contiguous() and kv_layer.dtype == torch.int8 and k.dtype == torch.float32:
            int8 = _int8_kernels()
            if int8 is not None:
                return int8.write_q8(k, v, kv_layer, *slots)
        if (
            self.kernel is not None
            and kv_layer.is_contiguous()
            and k.dtype == kv_layer.dtype
            and k.dtype in _PLAIN
            and _heads_contiguous(k)
            and _heads_contiguous(v)
        ):
            return self.kernel.write_kv(k, v, kv_layer, *slots)
        return super().write_kv(k, v, kv_layer, meta)

    def _kernel_for(self, cache_dtype: torch.dtype) -> Any | None:
        if cache_dtype == torch.float32:
            return None if self.kernel is None else self.kernel.paged_decode
        if cache_dtype == torch.bfloat16:
            return None if self.kernel is None else self.kernel.paged_decode_bf16
        if cache_dtype == torch.int8:
            int8 = _int8_kernels()
            return None if int8 is None else int8.paged_decode_q8
        return None


_PLAIN = (torch.float32, torch.bfloat16)


def _heads_contiguous(x: Tensor) -> bool:
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def _amx_kernel() -> Any | None:
    """Decode with its scores on AMX (engine/cpu_kernels/paged_decode_amx.cpp): for a
    bfloat16 cache and bfloat16 queries (float32 ones too: it narrows them, exactly, as they
    were bfloat16), on CPUs with AMX; None elsewhere."""
    module = cpu_kernels.load_available("paged_decode_amx")
    return None if module is None else module.paged_decode_bf16


def _amx_shapes(q: Tensor, kv_layer: Tensor) -> bool:
    """Block size a multiple of 16, head size of 32, at most 16 query heads per KV head."""
    block_size, kv_heads = kv_layer.shape[2], kv_layer.shape[3]
    return block_size % 16 == 0 and q.shape[2] % 32 == 0 and q.shape[1] // kv_heads <= 16


def _int8_kernels() -> Any | None:
    return cpu_kernels.load("kv_int8")  # cached; built when an int8 cache first needs it
