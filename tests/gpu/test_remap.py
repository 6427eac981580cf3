"""engine/kv_cache/remap.py on the GPU: an unlike prefill layout lands in a decode cache in
VRAM exactly as it does in host memory (heads split and joined, blocks re-cut, int8
quantized), the copies running on the device."""

from __future__ import annotations

import pytest
import torch

from core.kv_layout import kv_head_range
from engine.kv_cache.remap import Source, land
from tests.engine.test_kv_remap import (
    CASES,
    DTYPES,
    HEAD_DIM,
    HEADS,
    LAYERS,
    TOKENS,
    cache_of,
    write,
)

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.mark.parametrize(("p_tp", "d_tp", "p_block", "d_block", "p_dtype", "d_dtype"), CASES)
def test_landing_on_the_device_equals_landing_in_host_memory(
    p_tp: int, d_tp: int, p_block: int, d_block: int, p_dtype: str, d_dtype: str
) -> None:
    torch.manual_seed(0)
    kv = torch.randn(LAYERS, 2, TOKENS, HEADS, HEAD_DIM)
    p_ids, d_ids = (
        list(range(15, 15 - -(-TOKENS // p_block), -1)),
        list(range(-(-TOKENS // d_block))),
    )
    sources = []
    for rank in range(p_tp):
        held = kv_head_range(HEADS, p_tp, rank)
        cache = cache_of(p_block, len(held), DTYPES[p_dtype])
        write(cache, p_ids, kv[:, :, :, held.start : held.stop], 0)
        sources.append(Source(cache, p_ids, 0, held))
    on_device = [Source(s.cache.to(CUDA), s.block_ids, 0, s.heads) for s in sources]
    for rank in range(d_tp):
        heads = kv_head_range(HEADS, d_tp, rank)
        host = cache_of(d_block, len(heads), DTYPES[d_dtype])
        device = host.to(CUDA)
        land(host, d_ids, heads, range(d_block, TOKENS), sources)
        land(device, d_ids, heads, range(d_block, TOKENS), on_device)
        assert torch.equal(device.cpu().view(torch.uint8), host.view(torch.uint8))
