"""The segmented LoRA kernel (Triton, under the interpreter on CPU) against its torch
reference: rows of several adapters and of none, in any order, every dtype."""

from __future__ import annotations

import os

# Read when `@triton.jit` runs: set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from engine.kernels.lora import lora_add
from engine.lora.weights import LoRABatch, add_lora
from tests.engine.test_kernels_common import TOLERANCE


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("rows", "k", "n", "w"), [(1, 64, 96, 16), (9, 80, 200, 48)])
def test_segmented_lora_equals_the_reference(dtype, rows: int, k: int, n: int, w: int) -> None:
    g = torch.Generator().manual_seed(rows + k)
    slots = torch.tensor([(i * 5) % 4 - 1 for i in range(rows)], dtype=torch.int32)  # -1..2
    x = torch.randn(rows, k, generator=g).to(dtype)
    a = (torch.randn(3, k, w, generator=g) / k**0.5).to(dtype)
    b = (torch.randn(3, w, n, generator=g) / w**0.5).to(dtype)
    y = torch.randn(rows, n, generator=g).to(dtype)
    groups = tuple((s, torch.nonzero(slots == s).flatten()) for s in range(3) if (slots == s).any())
    want = y.float().clone()
    add_lora(want, x.float(), a.float(), b.float(), LoRABatch(groups))
    got = y.clone()
    lora_add(got, x, a, b, slots)
    torch.testing.assert_close(got.float(), want, **TOLERANCE[dtype])
    untouched = slots < 0
    assert torch.equal(got[untouched], y[untouched])


def test_bad_shapes_are_refused_naming_the_argument() -> None:
    x, a, b = torch.zeros(2, 8), torch.zeros(1, 8, 4), torch.zeros(1, 4, 6)
    with pytest.raises(ValueError, match="slots"):
        lora_add(torch.zeros(2, 6), x, a, b, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="b has shape"):
        lora_add(torch.zeros(2, 6), x, a, torch.zeros(1, 5, 6), torch.zeros(2, dtype=torch.int32))
