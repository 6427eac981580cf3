"""Online calibration from load reports' step totals (router.routing.step_rate)."""

from __future__ import annotations

import pytest

from core.events import WorkerLoad
from core.step_stats import StepTotals
from router.routing.step_rate import StepRate


def report(at: float, tokens: int, busy: float, prompt: int = 0, cached: int = 0) -> WorkerLoad:
    steps = StepTotals(steps=tokens // 100, prefill_tokens=tokens, forward_s=busy)
    return WorkerLoad("p", "prefill", 0, 0, 0, 10, 10, at, prompt, cached, steps)


def test_rates_come_from_deltas_between_reports() -> None:
    rate = StepRate(alpha=0.5)
    rate.update(report(0.0, 1000, 5.0, 1000, 0))  # a baseline only: totals since start
    assert rate.s_per_token == 0
    rate.update(report(4.0, 3000, 7.0, 3000, 1000))
    assert rate.s_per_token == 2.0 / 2000
    assert rate.reuse_rate == 0.5
    assert rate.utilization == 0.5 * (2.0 / 4.0)
    rate.update(report(8.0, 5000, 11.0, 5000, 1000))  # 4 s / 2000 tokens, smoothed
    assert rate.s_per_token == (1e-3 + 2e-3) / 2


def test_steps_longer_than_the_reports_interval_read_busy_not_idle() -> None:
    """A saturated worker whose steps take 1 s, reported every 0.1 s: each step's second lands
    in one report. Counted per window and clipped, nine windows in ten read idle and the
    estimate hovered near 0.1; carried over, it reads the worker busy."""
    rate = StepRate(alpha=0.3)
    rate.update(report(0.0, 0, 0.0))
    for tick in range(1, 101):
        rate.update(report(tick / 10, 0, float(tick // 10)))
    assert rate.utilization > 0.95
    for tick in range(101, 201):  # then idle: the carried seconds run out, the estimate falls
        rate.update(report(tick / 10, 0, 10.0))
    assert rate.utilization < 0.05


def test_small_intervals_wait_and_a_restart_rebaselines() -> None:
    rate = StepRate(min_tokens=500)
    rate.update(report(0.0, 1000, 1.0))
    rate.update(report(1.0, 1100, 2.0))  # 100 tokens: too few to say anything
    assert rate.s_per_token == 0
    rate.update(report(2.0, 2000, 2.0))
    assert rate.s_per_token == 1.0 / 1000
    rate.update(report(3.0, 10, 0.5))  # restarted: totals went back
    assert rate.s_per_token == 1.0 / 1000
    rate.update(report(4.0, 1010, 2.5))  # 2 s / 1000 tokens since the restart
    assert rate.s_per_token > 1.0 / 1000


def test_the_last_report_s_engine_seconds_are_kept_whatever_the_interval() -> None:
    """What the ttft policy's measured bound counts (busy_s): every report's total, small
    intervals and restarts included."""
    rate = StepRate(min_tokens=500)
    for at, tokens, busy in ((0.0, 1000, 1.0), (1.0, 1100, 1.5), (2.0, 10, 0.25)):
        rate.update(report(at, tokens, busy))
        assert rate.busy_s == busy


def test_attention_time_is_split_off_where_the_engine_times_it() -> None:
    """Attention seconds per query-key pair and the rest per token; GPUs report no attention
    time and keep one rate per token."""
    rate = StepRate(alpha=1.0)

    def timed(at: float, tokens: int, pairs: int, busy: float, attention: float) -> WorkerLoad:
        steps = StepTotals(
            steps=1, prefill_tokens=tokens, prefill_pairs=pairs, forward_s=busy,
            attention_s=attention,
        )  # fmt: skip
        return WorkerLoad("p", "prefill", 0, 0, 0, 10, 10, at, steps=steps)

    rate.update(timed(0.0, 0, 0, 0.0, 0.0))
    rate.update(timed(1.0, 1000, 2_000_000, 3.0, 2.0))
    assert rate.s_per_pair == 2.0 / 2_000_000
    assert rate.s_per_token_linear == 1.0 / 1000
    assert rate.s_per_token == 3.0 / 1000  # the average stays: queued tokens are priced by it
    gpu = StepRate(alpha=1.0)
    gpu.update(timed(0.0, 0, 0, 0.0, 0.0))
    gpu.update(timed(1.0, 1000, 2_000_000, 3.0, 0.0))
    assert gpu.s_per_pair == 0 and gpu.s_per_token_linear == 0 and gpu.s_per_token == 3e-3


def test_reuse_counts_prefix_pulled_from_peers() -> None:
    """A worker fed by pulls has few hits of its own; its prompts are still reused work."""
    rate = StepRate(alpha=1.0)
    steps = StepTotals(steps=1, prefill_tokens=0, forward_s=0.0)
    rate.update(WorkerLoad("p", "prefill", 0, 0, 0, 10, 10, 0.0, 0, 0, steps))
    more = StepTotals(steps=2, prefill_tokens=1000, forward_s=1.0)
    rate.update(
        WorkerLoad("p", "prefill", 0, 0, 0, 10, 10, 1.0, 4000, 1000, more, 2000)
    )  # 1,000 hits, 2,000 pulled, 1,000 computed of 4,000 prompt tokens
    assert rate.reuse_rate == 0.75


def test_restore_times_per_tier_come_from_deltas() -> None:
    rate = StepRate(alpha=0.5)

    def restores(at: float, blocks: list[int], seconds: list[float]) -> WorkerLoad:
        steps = StepTotals(tier_restored_blocks=blocks, tier_restore_s=seconds)
        return WorkerLoad("p", "prefill", 0, 0, 0, 10, 10, at, steps=steps)

    rate.update(restores(0.0, [], []))  # no tiers yet
    assert rate.restore_s_per_block == []
    rate.update(restores(1.0, [10, 0], [1.0, 0.0]))  # a baseline: totals since start
    assert rate.restore_s_per_block == [0.0, 0.0]
    rate.update(restores(2.0, [20, 4], [1.5, 0.4]))
    assert rate.restore_s_per_block == [0.05, 0.1]
    rate.update(restores(3.0, [30, 4], [2.5, 0.4]))  # host 0.1 s/block now, smoothed
    assert rate.restore_s_per_block == pytest.approx([0.075, 0.1])
    rate.update(restores(4.0, [2, 0], [0.1, 0.0]))  # restarted: the old estimate stays
    assert rate.restore_s_per_block == pytest.approx([0.075, 0.1])
    rate.update(restores(5.0, [12, 0], [1.1, 0.0]))  # 0.1 s/block since the restart
    assert rate.restore_s_per_block == pytest.approx([0.0875, 0.1])
