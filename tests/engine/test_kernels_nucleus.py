"""The nucleus threshold kernel (engine/kernels/nucleus.py) under Triton's interpreter: each
row's threshold is the last logit a sort keeps (float64 brute force; where the mass before a
token is within float32's rounding of p, either side of it), whatever the row's shape, its
dtype, its stride, its masked tokens or its p."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import math

import pytest
import torch

from engine.kernels.nucleus import nucleus_threshold


def sorted_threshold(row: torch.Tensor, top_p: float) -> float:
    """The smallest logit a sort keeps: the tokens whose mass before them is below top_p."""
    values = row.double().sort(descending=True).values
    probs = values.softmax(-1)
    return float(values[(probs.cumsum(-1) - probs) < top_p].min())


def assert_threshold(row: torch.Tensor, top_p: float, got: float) -> None:
    """`got` is one of the row's logits; the mass above it is below top_p and with it at least
    top_p; it is the sort's unless the mass is within float32's rounding of top_p."""
    assert got in set(row.tolist())
    probs = row.double().softmax(-1)
    above, kept = float(probs[row > got].sum()), float(probs[row >= got].sum())
    assert above < top_p + 1e-6 and kept >= top_p - 1e-6, (above, kept, top_p)
    if min(abs(above - top_p), abs(kept - top_p)) > 1e-5:
        assert got == sorted_threshold(row, top_p)


@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0, 30.0])
@pytest.mark.parametrize("vocab", [7, 1000, 5003])
def test_thresholds_are_the_sort_s_last_kept_logit(scale: float, vocab: int) -> None:
    generator = torch.Generator().manual_seed(vocab + int(scale * 10))
    top_p = [0.01, 0.3, 0.9, 0.999]
    logits = torch.randn(len(top_p), vocab, generator=generator) * scale
    logits[1] += 100.0  # far from 0: the search runs over large floats
    logits[2] -= 50.0
    got = nucleus_threshold(logits, torch.tensor(top_p)).tolist()
    for i, p in enumerate(top_p):
        assert_threshold(logits[i], p, got[i])


def test_masked_tokens_padded_rows_and_half_precision() -> None:
    generator = torch.Generator().manual_seed(1)
    wide = torch.randn(3, 2100, generator=generator) * 2.0
    logits = wide[:, :2000]  # rows 2,100 apart: a padded LM head
    logits[0, ::2] = -math.inf  # a grammar's mask
    p = torch.tensor([0.8, 0.95, 0.5])
    got = nucleus_threshold(logits, p).tolist()
    for i in range(3):
        assert_threshold(logits[i], float(p[i]), got[i])

    bf16 = (torch.randn(2, 3000, generator=generator) * 3.0).to(torch.bfloat16)
    got = nucleus_threshold(bf16, torch.tensor([0.9, 0.6]))
    for i, p_i in enumerate((0.9, 0.6)):
        row = bf16[i].float()
        # bf16 logits tie often: equal logits at the threshold are all kept, so the count is
        # at least the sort's, and the mass before the threshold's ties is below p.
        kept = row >= got[i]
        assert int(kept.sum()) >= int((row >= sorted_threshold(row, p_i)).sum())
        probs = row.double().softmax(-1)
        assert float(probs[row > got[i]].sum()) < p_i <= float(probs[kept].sum()) + 1e-12


def test_equal_logits_are_kept_together() -> None:
    flat = torch.zeros(1, 64)
    assert nucleus_threshold(flat, torch.tensor([0.5])).tolist() == [0.0]  # all 64 kept
    two = torch.tensor([[2.0, 2.0, 0.0, 0.0]])
    assert nucleus_threshold(two, torch.tensor([0.3])).tolist() == [2.0]


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="top_p"):
        nucleus_threshold(torch.zeros(2, 8), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="logits"):
        nucleus_threshold(torch.zeros(8), torch.tensor([0.5]))
