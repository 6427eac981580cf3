"""`baton profile`'s KV transfer measurement (planner/transfer.py) and its fit (core/perf)."""

from __future__ import annotations

import math

import pytest

from core.kv_layout import KVLayout
from core.perf.fit import Sample, fit_transfer


def test_the_fit_recovers_a_known_latency_and_bandwidth() -> None:
    latency_s, bytes_per_s = 0.25e-3, 6e9
    sizes = [n * 256 * 1024 for n in (1, 4, 16, 64, 256)]
    # Three repeats of each size, the slower ones disturbed: the fastest of each is fitted.
    samples = [
        Sample((b,), (latency_s + b / bytes_per_s) * (1 + slow))
        for b in sizes
        for slow in (0.0, 0.3, 0.1)
    ]
    fit = fit_transfer(samples)
    assert fit["transfer_latency_ms"] == pytest.approx(0.25, rel=1e-6)
    assert fit["transfer_gbps"] == pytest.approx(6.0, rel=1e-6)
    assert fit["max_fit_error"] < 1e-9


def test_a_time_that_does_not_grow_with_the_bytes_is_no_bandwidth() -> None:
    flat = [Sample((b,), 1e-3 - b * 1e-12) for b in (1 << 10, 1 << 20, 1 << 24)]
    with pytest.raises(ValueError, match="did not grow"):
        fit_transfer(flat)


@pytest.mark.parametrize(("backend", "tp"), [("shm", 2), ("nixl", 1)])
def test_a_transfer_between_two_processes_is_measured(backend: str, tp: int) -> None:
    # At tp 2, one pair per rank, each with its rank's heads, sending at once (a worker's
    # ranks each move their own heads); the samples count every rank's bytes.
    from kv_transfer import unavailable_reason
    from planner.transfer import MIN_LARGEST_BYTES, measure_transfer

    if reason := unavailable_reason(backend):
        pytest.skip(reason)
    layout = KVLayout(num_layers=2, num_blocks=1, block_size=16, num_kv_heads=4 // tp,
                      head_dim=64, tp_size=tp)  # fmt: skip
    result = measure_transfer(layout, "test-model", backend, (1, 4, 16), repeat=2, timeout_s=30)
    assert result.block_bytes == tp * layout.block_bytes_all_layers
    assert result.num_ranks == tp and ("2 rank pairs at once" in result.source) == (tp == 2)
    blocks = {row["blocks"] for row in result.sample_rows()}
    # The counts asked for, and more until one rank's send moves MIN_LARGEST_BYTES.
    assert {1, 4, 16} < blocks
    assert max(blocks) * layout.block_bytes_all_layers >= MIN_LARGEST_BYTES
    assert all(sum(r["blocks"] == n for r in result.sample_rows()) == 2 for n in blocks)
    assert all(s.seconds > 0 for s in result.samples)
    assert math.isfinite(result.gbps) and result.gbps > 0
    assert math.isfinite(result.latency_ms) and result.latency_ms >= 0
    assert result.source.startswith(f"measured over {backend} on ")
