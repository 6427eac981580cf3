"""Paged attention through the Triton kernels (engine/kernels): the CUDA path, also runnable
on CPU under `TRITON_INTERPRET=1` (forced with BATON_ATTENTION=triton).

Per layer: reshape-and-cache writes the step's new K/V (rotating q and k in the same kernel,
engine/kernels/rotary_cache.py, unless BATON_FUSED_KERNELS=0), then the decode kernel serves the
first `num_decodes` rows and the prefill kernel every chunk, all reading K/V from the cache.
The chunk layout (device tensors and the kernel's tile list) is built once per step and kept
in `meta.backend_state`, so every layer after the first reuses it; a step replayed from a
graph brings its fixed-size layout in `meta.prefill_layout` (engine/step_graphs.py).
"""

from __future__ import annotations

import dataclasses

from core import env
from engine.attention.backend import AttentionBackend, AttentionMetadata, Rotation, Tensor

_STATE_PREFIX = "triton_prefill."


class TritonPagedAttention(AttentionBackend):
    name = "triton"
    step_graphs = True

    def __init__(self) -> None:
        # Imported here, not at module level, so registering this backend never needs triton.
        try:
            from engine.kernels import (
                decode_attention,
                prefill_attention,
                reshape_and_cache,
                rotary_cache,
            )
        except ImportError as e:
            raise RuntimeError(
                "the 'triton' attention backend needs the triton package "
                "(pip install 'baton[gpu]'); or use attention_backend='torch'"
            ) from e
        self._decode = decode_attention.paged_decode_attention
        self._prefill = prefill_attention.paged_prefill_attention
        self._write = reshape_and_cache.reshape_and_cache
        self._rotate_and_write = rotary_cache.rotary_and_cache
        self.fuses_rotary = env.FUSED_KERNELS.get()
        self._layout_cls = prefill_attention.PrefillLayout
        self._launch_for = prefill_attention.launch_for

    def write_kv(self, k: Tensor, v: Tensor, kv_layer: Tensor, meta: AttentionMetadata) -> None:
        self._write(k, v, kv_layer, meta.slot_blocks, meta.slot_offsets)

    def rotate_and_write_kv(
        self, rotation: Rotation, q: Tensor, k: Tensor, v: Tensor, kv_layer: Tensor,
        meta: AttentionMetadata,
    ) -> None:  # fmt: skip
        self._rotate_and_write(
            rotation.positions, q, k, v, rotation.cos, rotation.sin, kv_layer,
            meta.slot_blocks, meta.slot_offsets,
        )  # fmt: skip

    def decode_into(
        self, out: Tensor, q: Tensor, kv_layer: Tensor, meta: AttentionMetadata, scale: float
    ) -> None:
        tables, lens, ws = meta.decode_block_tables, meta.decode_seq_lens, meta.decode_workspace
        if ws is None:
            self._decode(q, kv_layer, tables, lens, scale, out=out)
        else:
            self._decode(q, kv_layer, tables, lens, scale, ws.num_splits, out, ws.partial, ws.lse)

    def prefill_into(
        self, out: Tensor, q: Tensor, k: Tensor, v: Tensor, kv: Tensor, meta: AttentionMetadata,
        scale: float,
    ) -> None:  # fmt: skip
        self._prefill(q, kv, self._layout(meta, q, kv), scale, out=out)

    def _layout(self, meta: AttentionMetadata, q: Tensor, kv: Tensor):
        """The step's chunk layout, its tiles as high as the launch on `kv` wants."""
        if meta.prefill_layout is not None:
            return meta.prefill_layout
        fields = [f.name for f in dataclasses.fields(self._layout_cls)]
        state = meta.backend_state
        if _STATE_PREFIX + fields[0] not in state:
            chunks = meta.prefills
            layout = self._layout_cls.build(
                [c.query_start for c in chunks],
                [c.query_len for c in chunks],
                [c.seq_len for c in chunks],
                [c.block_ids for c in chunks],
                q.device,
                self._launch_for(kv, q.dtype, q.shape[-1], q.device).block_m,
            )
            for name in fields:
                state[_STATE_PREFIX + name] = getattr(layout, name)
            return layout
        return self._layout_cls(**{name: state[_STATE_PREFIX + name] for name in fields})
