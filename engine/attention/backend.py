"""The attention-backend interface and the per-step batch layout it reads.

A step's new tokens are one flat batch, decode tokens first:

    tokens: [ d_0 d_1 ... d_{B-1} | c_0 c_0 c_0 c_0 | c_1 c_1 | ... ]
              num_decodes (1 each)   prefill/extend chunks (query_len each)

Each token's K/V goes to cache slot (slot_blocks[t], slot_offsets[t]). A chunk's queries
attend causally to its sequence's first `seq_len` positions: the cached prefix (prefix-cache
hits, earlier chunks, KV received from a prefill worker) plus themselves.

The per-layer KV cache is one slice `kv[layer]` of the worker's cache tensor:
`[num_blocks, 2 (K, V), block_size, num_kv_heads, head_dim]`, so one layer's block is one
contiguous region for the transfer engine.

This module imports none of the backends (they import it); registry.py looks them up by name.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from core.step_stats import StepTotals


@dataclass(frozen=True)
class PrefillChunk:
    query_start: int
    query_len: int
    seq_len: int
    """Context length after this chunk (cached prefix + query_len)."""
    block_ids: torch.Tensor
    """[ceil(seq_len / block_size)] long: the sequence's blocks covering the context."""


@dataclass(frozen=True)
class DecodeWorkspace:
    """Split-KV scratch fixed ahead of time, for a decode step replayed from a CUDA graph:
    the kernel may neither choose its split count from the step's context lengths nor
    allocate per call. Shared by every layer (they run one after another on one stream)."""

    num_splits: int
    partial: torch.Tensor
    """[num_decodes, Hq, num_splits, D] float32."""
    lse: torch.Tensor
    """[num_decodes, Hq, num_splits] float32."""


@dataclass
class AttentionMetadata:
    block_size: int
    slot_blocks: torch.Tensor
    """[T] long: cache block of each new token."""
    slot_offsets: torch.Tensor
    """[T] long: position inside that block."""
    num_decodes: int
    decode_block_tables: torch.Tensor
    """[num_decodes, max_blocks] long, padded with block 0 (masked out)."""
    decode_seq_lens: torch.Tensor
    """[num_decodes] long: context length including the new token."""
    prefills: list[PrefillChunk] = field(default_factory=list)
    layer_done: Callable[[int], None] | None = None
    """Called with the layer index once that layer's new K/V is in the cache (the hook the
    KV-transfer connector uses to send a layer while the next one computes)."""
    backend_state: dict[str, Any] = field(default_factory=dict)
    """Per-step values a backend derives once and reuses in every layer (masks, indices,
    the shared prefixes of engine/attention/cascade.py)."""
    totals: StepTotals | None = None
    """Set where kernels run synchronously (CPU): attention adds its time here."""
    decode_workspace: DecodeWorkspace | None = None
    """Set in a captured decode step (engine/cuda_graphs.py); backends without split-KV
    scratch ignore it."""
    prefill_layout: Any | None = None
    """Set in a captured step of any kind (engine/step_graphs.py) instead of `prefills`: the
    chunks as fixed-size device tensors, padded (a backend with `step_graphs` reads it).
    There every row of the step is given to `decode_into`, the rows that are not decodes
    with a context length of 0."""

    @property
    def num_tokens(self) -> int:
        return int(self.slot_blocks.shape[0])


Tensor = torch.Tensor


@dataclass(frozen=True)
class Rotation:
    """Rotary embedding still to be applied to a step's q and k, handed to a backend that
    applies it in its KV write (`AttentionBackend.fuses_rotary`): the tokens' positions and
    the cos / sin tables (engine/layers/rotary.py)."""

    positions: Tensor
    cos: Tensor
    sin: Tensor


class AttentionBackend(ABC):
    """Computes attention for one layer of a step.

    `forward` is the same for every backend: first the step's new K/V go into `kv_layer` at
    the metadata's slots (the only mutation), then the decode rows (the batch's first
    `num_decodes`) and the prefill chunks attend. A backend supplies those three operations;
    none may read cache slots beyond a sequence's `seq_len`, so blocks still being filled by
    a transfer for other requests are never read.
    """

    name: str = ""
    step_graphs: bool = False
    """Whether a whole step, prompt chunks and decode rows together, can replay from a
    graph: `prefill_into` reads `meta.prefill_layout` and `decode_into` passes over rows
    of context length 0 (engine/step_graphs.py)."""
    fuses_rotary: bool = False
    """Whether `forward` takes q and k before their rotary embedding (a `Rotation`) and
    rotates them in its KV write (`rotate_and_write_kv`)."""

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, kv_layer: Tensor, meta: AttentionMetadata,
        scale: float, rotation: Rotation | None = None,
    ) -> Tensor:  # fmt: skip
        """q: [T, Hq, D]; k, v: [T, Hk, D]; returns [T, Hq, D]. With `rotation` (only where
        the backend `fuses_rotary`), q and k are rotated in place as K/V are written."""
        start = time.perf_counter()
        if rotation is None:
            self.write_kv(k, v, kv_layer, meta)
        else:
            self.rotate_and_write_kv(rotation, q, k, v, kv_layer, meta)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            self.decode_into(out[:nd], q[:nd], kv_layer, meta, scale)
        if meta.prefills or meta.prefill_layout is not None:
            self.prefill_into(out, q, k, v, kv_layer, meta, scale)
        if meta.totals is not None:
            meta.totals.attention_s += time.perf_counter() - start
        return out

    @abstractmethod
    def write_kv(self, k: Tensor, v: Tensor, kv_layer: Tensor, meta: AttentionMetadata) -> None:
        """Store the step's new K/V in their cache slots (reshape-and-cache)."""

    def rotate_and_write_kv(
        self, rotation: Rotation, q: Tensor, k: Tensor, v: Tensor, kv_layer: Tensor,
        meta: AttentionMetadata,
    ) -> None:  # fmt: skip
        """Rotate q and k in place, then `write_kv`: in one kernel where `fuses_rotary`."""
        raise NotImplementedError(f"the {self.name!r} attention backend does not fuse rotary")

    @abstractmethod
    def decode_into(
        self, out: Tensor, q: Tensor, kv_layer: Tensor, meta: AttentionMetadata, scale: float
    ) -> None:
        """Attention of the decode rows `q` ([num_decodes, Hq, D]) over their caches."""

    @abstractmethod
    def prefill_into(
        self, out: Tensor, q: Tensor, k: Tensor, v: Tensor, kv: Tensor, meta: AttentionMetadata,
        scale: float,
    ) -> None:  # fmt: skip
        """Attention of every prefill chunk's rows (`meta.prefills`) into the same rows of
        `out`; `k`, `v` are the step's own K/V (a chunk without a cached prefix may use them)."""
