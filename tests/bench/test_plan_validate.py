"""`bench/planning/plan_validate.py`'s bookkeeping: a worker's step counters over a run (as every
`baton bench` run reports them), measured runs against a prediction, and the KV blocks a
served worker gets."""

from __future__ import annotations

import json

import pytest

from bench.planning import plan_validate as pv
from loadgen.run import step_totals


def exposition(forward: float, between: float, steps: int, rows: int) -> str:
    w = 'worker="decode-1"'
    return "\n".join([
        f'baton:worker_step_seconds_total{{{w},phase="forward"}} {forward}',
        f'baton:worker_step_seconds_total{{{w},phase="attention"}} {forward / 2}',
        f'baton:worker_step_seconds_total{{{w},phase="sample"}} 1.0',
        f'baton:worker_step_seconds_total{{{w},phase="between"}} {between}',
        f"baton:worker_steps_total{{{w}}} {steps}",
        f'baton:worker_step_tokens_total{{{w},kind="decode"}} {rows}',
        f'baton:worker_step_tokens_total{{{w},kind="prefill"}} 0',
    ])  # fmt: skip


def test_step_totals_are_the_growth_over_the_run_busy_without_attention_or_between() -> None:
    before = exposition(forward=10.0, between=0.5, steps=100, rows=300)
    after = exposition(forward=25.0, between=0.75, steps=400, rows=1200)
    (w,) = step_totals(after, before).values()
    # forward grew 15 s; sample 1 -> 1; attention is inside forward, between is the loop's.
    assert w == {"busy_s": 15.0, "between_s": 0.25, "steps": 300, "decode_rows": 900,
                 "prefill_tokens": 0}  # fmt: skip


def test_compare_takes_the_median_run_and_keeps_the_range() -> None:
    def run(ttft: float, tpot: float) -> dict:
        return {"ttft_s": {"p50": ttft, "p99": 2 * ttft}, "tpot_s": {"p50": tpot, "p99": tpot}}

    measured = [run(0.1, 0.02), run(0.3, 0.04), run(0.2, 0.03)]
    predicted = {"ttft_p50_ms": 100.0, "ttft_p99_ms": 400.0, "itl_p50_ms": 30.0,
                 "itl_p99_ms": 45.0}  # fmt: skip
    out = pv.compare(measured, predicted)
    assert out["measured_ms"]["ttft_p50"] == pytest.approx(200.0)
    assert out["measured_range_ms"]["ttft_p99"] == pytest.approx([200.0, 600.0])
    assert out["predicted_over_measured"] == {
        "ttft_p50": 0.5, "ttft_p99": 1.0, "tpot_p50": 1.0, "tpot_p99": 1.5
    }  # fmt: skip


def test_each_run_predicted_from_its_own_profile_has_its_own_ratio() -> None:
    """--reprofile: a run that carries its own prediction is compared with it alone."""
    runs = [{"ttft_s": {"p50": t, "p99": t}, "tpot_s": {"p50": 0.02, "p99": 0.02},
             "predicted_ms": {"ttft_p50_ms": p, "ttft_p99_ms": p, "itl_p50_ms": 20.0,
                              "itl_p99_ms": 10.0}}
            for t, p in ((0.1, 90.0), (0.2, 220.0))]  # fmt: skip
    out = pv.compare(runs, {"ttft_p50_ms": 155.0, "ttft_p99_ms": 155.0, "itl_p50_ms": 20.0,
                            "itl_p99_ms": 10.0})  # fmt: skip
    assert out["per_run_predicted_over_measured"]["ttft_p50"] == [0.9, 1.1]
    assert out["per_run_predicted_over_measured"]["tpot_p99"] == [0.5, 0.5]


def test_kv_blocks_are_what_baton_serve_gives_a_worker(tmp_path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"kv_bytes_per_token": 16384}))
    assert pv.kv_blocks(profile, 1.0) == 4096  # 1 GiB of 16-token blocks of 256 KiB
    profile.write_text(json.dumps({}))
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        pv.kv_blocks(profile, 1.0)
