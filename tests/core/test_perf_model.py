"""The performance model (core/perf): its formulas, its fit, a profile's JSON."""

from __future__ import annotations

import json
import random

import pytest

from core.perf import (
    DecodeProfile,
    PrefillCost,
    WorkerProfile,
    attention_area,
    attention_pairs,
    prefill_terms,
)
from core.perf.fit import Sample, fastest, fit_decode, fit_prefill, least_squares
from core.perf.model import DecodeCost, TransferCost


def test_a_prefill_costs_its_steps_tokens_and_attention_pairs() -> None:
    cost = PrefillCost(per_step=10.0, per_token=1.0, per_kpair=2.0, chunk_tokens=64)
    # 100 new tokens after 50 cached: 2 steps, 100 tokens, an attention area of 100 * 100
    # (the pairs, 100 * 50 + 100 * 101 / 2, to within 100 / 2).
    assert attention_pairs(100, 50) == 10_050 and attention_area(100, 50) == 10_000
    assert cost(100, 50) == pytest.approx(2 * 10.0 + 100 * 1.0 + 2.0 * 10_000 / 1000)
    assert cost.attention(100, 50) == pytest.approx(2.0 * 10.0)
    # No chunk size known: one step.
    assert PrefillCost(10.0, 1.0)(1000) == pytest.approx(1010.0)
    assert PrefillCost(10.0, 1.0, chunk_tokens=64)(0) == pytest.approx(10.0)  # the first token


def test_decode_and_transfer_costs() -> None:
    assert DecodeCost(5.0, 1.0, 0.5)(8, 2000) == pytest.approx(5.0 + 8.0 + 0.5 * 8 * 2.0)
    ms = TransferCost.at_rate(1_000_000, 2.0, 1.0, unit_s=1e-3)  # 1 MB a token at 2 GB/s
    assert ms(10) == pytest.approx(1.0 + 10 * 0.5)
    assert TransferCost.at_rate(1_000_000, 0.0, 1.0)(10) == 1.0  # no rate: latency only


def test_a_fit_recovers_the_profile_the_samples_were_made_from() -> None:
    truth = PrefillCost(per_step=4.0, per_token=0.2, per_kpair=0.03, chunk_tokens=1 << 20)
    samples = [Sample((1, n, c), truth(n, c) / 1000) for n in (16, 64, 300, 900) for c in (0, 500)]
    fit = fit_prefill(samples)
    assert (fit["step_ms"], fit["token_ms"], fit["attn_ms"]) == pytest.approx((4.0, 0.2, 0.03))
    decode = DecodeCost(5.0, 1.0, 0.5)
    rows = [Sample((b, L), decode(b, L) / 1000) for b in (1, 4, 16) for L in (128, 1024)]
    fit = fit_decode(rows)
    assert (fit["decode_step_ms"], fit["decode_row_ms"], fit["decode_ctx_ms"]) == pytest.approx(
        (5.0, 1.0, 0.5)
    )


def test_a_profile_reads_back_what_it_says(tmp_path) -> None:
    path = tmp_path / "p.json"
    raw = {"step_ms": 10, "token_ms": 1, "attn_ms": 2, "chunk_tokens": 64, "tp": 2,
           "kv_bytes_per_token": 1e6, "transfer_gbps": 2, "transfer_latency_ms": 1,
           "decode": {"decode_step_ms": 5, "decode_row_ms": 1, "decode_ctx_ms": 0.5}}  # fmt: skip
    path.write_text(json.dumps(raw))
    prefill, decode = WorkerProfile.load(path), DecodeProfile.load(path)
    assert prefill.tp == 2 and prefill.can_transfer
    assert prefill.prefill_ms(100, 50) == PrefillCost(10, 1, 2, 64)(100, 50)
    assert prefill.transfer_ms(10) == pytest.approx(6.0)
    assert decode.step(8, 2000) == DecodeCost(5, 1, 0.5)(8, 2000)
    path.write_text(json.dumps({**raw, "token_ms": 0}))
    with pytest.raises(ValueError, match="not a usable profile"):
        WorkerProfile.load(path)


def test_least_squares_recovers_the_terms_it_was_built_from() -> None:
    rng = random.Random(1)
    rows = [prefill_terms(1, n, c) for n in (16, 64, 300, 900) for c in (0, 500)]
    truth = (0.004, 0.0002, 0.00003)
    ys = [sum(t * x for t, x in zip(truth, r)) * (1 + rng.uniform(-1e-9, 1e-9)) for r in rows]
    assert least_squares(rows, ys) == pytest.approx(truth, rel=1e-4)
    with pytest.raises(ValueError, match="separate"):
        least_squares([(1.0, 2.0), (2.0, 4.0)], [1.0, 2.0])  # one shape, two unknowns


def test_least_squares_is_the_non_negative_optimum_not_a_clipped_one() -> None:
    # Unconstrained, the first term fits negative; clipping it at 0 would leave the second
    # term's share as fitted beside a negative first. The optimum refits the second alone.
    rows = [(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]
    ys = [1.0, 4.0, 6.0]  # unconstrained: -1.333 + 2.5 x
    fit = least_squares(rows, ys)
    assert fit[0] == 0.0
    assert fit[1] == pytest.approx(sum(x * y for (_, x), y in zip(rows, ys)) / 14)  # 2.285..
    grid = [(a / 100, b / 100) for a in range(0, 200) for b in range(100, 300)]

    def sse(c):  # type: ignore[no-untyped-def]
        return sum((y - c[0] * r[0] - c[1] * r[1]) ** 2 for r, y in zip(rows, ys))

    assert sse(fit) <= min(sse(c) for c in grid) + 1e-9


def test_the_fit_takes_the_fastest_repeat_of_each_shape() -> None:
    samples = [Sample((1, 16, 0), 0.9), Sample((1, 16, 0), 0.2), Sample((2, 8), 0.1)]
    assert fastest(samples) == [Sample((1, 16, 0), 0.2), Sample((2, 8), 0.1)]
