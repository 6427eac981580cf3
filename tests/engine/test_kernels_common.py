"""The interpreter's tolerances shared by the kernel tests (their paged caches come from
tests/support/paged_kv.py), and tests of the argument checks every host wrapper runs before
it launches."""

from __future__ import annotations

import os

# Read when `@triton.jit` runs: set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from tests.support.paged_kv import make_paged_contexts, to_page_one

TOLERANCE = {
    torch.float32: dict(atol=2e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def test_page_one_layout_holds_the_same_tokens() -> None:
    ctx = make_paged_contexts([5, 17], 2, 8, 16, torch.float32, seed=0)
    flat = to_page_one(ctx)
    for seq, n in enumerate(ctx.seq_lens):
        for p in range(n):
            a = ctx.kv_layer[ctx.block_ids[seq][p // 16], :, p % 16]
            b = flat.kv_layer[flat.block_ids[seq][p], :, 0]
            assert torch.equal(a, b)


def test_wrappers_reject_bad_arguments() -> None:
    from engine.kernels.decode_attention import paged_decode_attention
    from engine.kernels.reshape_and_cache import reshape_and_cache

    kv = torch.zeros(4, 2, 16, 2, 64)
    table = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="query heads not a multiple"):
        paged_decode_attention(torch.zeros(1, 3, 64), kv, table, lens, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode_attention(torch.zeros(1, 4, 32), kv, table, lens, 1.0)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode_attention(torch.zeros(1, 4, 64, dtype=torch.float16), kv, table, lens, 1.0)
    with pytest.raises(ValueError, match="last dimension"):
        paged_decode_attention(torch.zeros(1, 4, 128)[..., ::2], kv, table, lens, 1.0)
    with pytest.raises(ValueError, match="cache holds"):
        k = torch.zeros(1, 1, 64)
        reshape_and_cache(k, k, kv, lens, lens)
