"""The KV cache tensor: one allocation for all layers, registered once for transfers.

    kv[num_layers, num_blocks, 2 (K, V), block_size, num_kv_heads, head_dim]

so the (layer, block) pair is one contiguous region of `block_bytes` bytes at offset
`(layer * num_blocks + block) * block_bytes` — the unit the transfer engine moves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv_cache.shared_memory import shared_zeros


@dataclass(frozen=True)
class KVCacheShape:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    """Heads held by this rank."""
    head_dim: int
    dtype: torch.dtype

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one layer (K and V)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.block_size * self.num_kv_heads * self.head_dim * elem

    @property
    def bytes_per_block_all_layers(self) -> int:
        return self.block_bytes * self.num_layers

    def as_tuple(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.num_layers,
            self.num_blocks,
            2,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
        )


def num_blocks_for_memory(shape_per_block: KVCacheShape, memory_bytes: int) -> int:
    return max(1, memory_bytes // shape_per_block.bytes_per_block_all_layers)


def allocate_kv_cache(shape: KVCacheShape, device: torch.device) -> torch.Tensor:
    # Zeros, not empty: masked-out slots still enter the attention matmul as 0 * value,
    # and uninitialised memory could hold NaN. On CPU in shared memory, so a same-host KV
    # transport can map it (see shared_memory.py).
    if device.type == "cpu":
        return shared_zeros(shape.as_tuple(), shape.dtype)
    return torch.zeros(shape.as_tuple(), dtype=shape.dtype, device=device)
