"""The CPU attention backend: the torch paged path, with decode served by a small C++ kernel
(`engine/cpu_kernels/paged_decode.cpp`, float32 and bfloat16 caches) that reads K/V straight
from the paged cache; an int8
cache (engine/kv_cache/quant.py) has its own kernels (`kv_int8.cpp`): decode that widens
the int8 values in registers instead of dequantizing a copy, and a one-pass quantizing write.
On CPUs with AMX a bfloat16 model's decode scores are tile products (`paged_decode_amx.cpp`);
there, and on CPUs with a fast AVX-512 BF16 (the same kernel's other build), rows that share
cached blocks attend them once together (engine/attention/cascade.py), and prompt chunks
attend their context and themselves causally straight from the cache
(`shared_attention.cpp`).

Why our own kernel: on CPU the torch path must gather every sequence's blocks into a padded
copy before attention (reading the cache twice and writing it once per layer per step);
PyTorch has no paged attention for CPU and Triton has no CPU backend. If the kernel cannot
be built here, the engine falls back to the plain torch backend and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine import cpu_kernels
from engine.attention import cascade
from engine.attention.backend import AttentionMetadata, Tensor
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
            tiled = cascade.tiled_kernel(q, kv_layer) is not None
            prefix = cascade.shared_prefix(meta, tiled=tiled)
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
            tiled = cascade.tiled_kernel(q, kv_layer) is not None
            if cascade.shared_prefix(meta, tiled=tiled) is not None:
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
        """On our tiled kernel (AMX, or a fast AVX-512 BF16) every chunk attends its cached
        context and itself straight from the cache (its K / V are written first), causally,
        all of a step's chunks in one call: no gather, no mask, no merge. One layer, bf16, 12 /
        4 heads of 64, against what ran before: 32 chunks of 64 tokens on one 1,024-token
        cached prefix (cascade: the shared part once, each chunk's own part by torch's flash
        attention, merged) 14.2 -> 6.4-6.9 ms on the AMX Xeon, 44.2 -> 11.2 on the AVX-512 BF16
        build (an AMD EPYC, Zen 5); a 1,088-token prompt without context (torch's causal flash
        attention over its own K / V) 4.3 -> 2.1 ms, 16.3 -> 3.0 on the EPYC; 256 tokens 0.37
        -> 0.14, 1.35 -> 0.20. Elsewhere (float32, int8 / fp8 caches, no tiled kernel) chunks
        on one cached prefix share it by cascade and the rest go one by one."""
        kernel = _tiled_prefill(q, kv)
        if kernel is not None and out.dtype == q.dtype and out.is_contiguous():
            kernel(q.contiguous(), kv, *_chunk_tables(meta), scale, out)
            return
        groups = cascade.shared_chunks(meta) if kv.dtype in _PLAIN else []
        if not groups:
            return super().prefill_into(out, q, k, v, kv, meta, scale)
        for group in groups:
            cascade.chunk_group_into(out, q, k, v, kv, group, meta.block_size, scale)
        grouped = {id(c) for group in groups for c in group.chunks}
        rest = [c for c in meta.prefills if id(c) not in grouped]
        self._chunks_into(out, q, k, v, kv, rest, scale)

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


def _tiled_prefill(q: Tensor, kv_layer: Tensor) -> Callable[..., None] | None:
    """Prompt chunks' causal attention on our tiled kernel (engine/cpu_kernels/
    shared_attention.cpp, cascade.kernel_module): (q, kv, block_tables, query_starts,
    query_lens, seq_lens, scale, out) -> None, for the shapes the shared-prefix kernel takes
    (any number of query rows); None elsewhere."""
    if cascade.tiled_kernel(q, kv_layer, rows=1) is None:
        return None
    module = cascade.kernel_module()
    return None if module is None else module.prefill_bf16


def _chunk_tables(meta: AttentionMetadata) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The step's chunks as the prefill kernel takes them, built once a step: block tables
    [C, M] (padded with block 0, never read), query starts, query lengths, context lengths."""
    state = meta.backend_state
    if "chunk_tables" not in state:
        chunks = meta.prefills
        width = max(int(c.block_ids.numel()) for c in chunks)
        tables = torch.zeros(len(chunks), width, dtype=torch.long)
        for row, c in zip(tables, chunks, strict=True):
            row[: c.block_ids.numel()] = c.block_ids
        state["chunk_tables"] = (
            tables,
            torch.tensor([c.query_start for c in chunks], dtype=torch.long),
            torch.tensor([c.query_len for c in chunks], dtype=torch.long),
            torch.tensor([c.seq_len for c in chunks], dtype=torch.long),
        )
    return state["chunk_tables"]


def _amx_shapes(q: Tensor, kv_layer: Tensor) -> bool:
    """Block size a multiple of 16, head size of 32, at most 16 query heads per KV head."""
    block_size, kv_heads = kv_layer.shape[2], kv_layer.shape[3]
    return block_size % 16 == 0 and q.shape[2] % 32 == 0 and q.shape[1] // kv_heads <= 16


def _int8_kernels() -> Any | None:
    return cpu_kernels.load("kv_int8")  # cached; built when an int8 cache first needs it
