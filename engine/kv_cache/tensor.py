"""The KV cache tensor: one allocation for all layers, registered once for transfers, laid
out as its `core.kv_layout.KVLayout` describes (the offsets are drawn there):

    kv[num_layers, num_blocks, 2 (K, V), block_size, num_kv_heads, head_dim]
"""

from __future__ import annotations

import torch

from core.kv_layout import KVLayout
from engine.kv_cache.shared_memory import shared_zeros


def allocate_kv_cache(layout: KVLayout, device: torch.device) -> torch.Tensor:
    dtype = getattr(torch, layout.dtype)
    # Zeros, not empty: masked-out slots still enter the attention matmul as 0 * value,
    # and uninitialised memory could hold NaN. On CPU in shared memory, so a same-host KV
    # transport can map it (see shared_memory.py).
    if device.type == "cpu":
        return shared_zeros(layout.shape, dtype)
    return torch.zeros(layout.shape, dtype=dtype, device=device)
