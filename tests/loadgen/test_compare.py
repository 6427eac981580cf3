"""The comparison's verdict against the issue's targets, on synthetic summaries, and the
client's error-message cleanup."""

from __future__ import annotations

import json

import pytest

from loadgen.client import _error_message
from loadgen.compare import EXPERIMENTS, sustains, verdict


def _summary(rate: float, ttft_p50: float, tpot_p99: float, goodput: float,
             ttft_mean: float = 1.0, errors: int = 0) -> dict:  # fmt: skip
    return {
        "rate": rate, "num_errors": errors, "goodput": goodput, "slo": {"ttft_s": 5.0},
        "ttft_s": {"p50": ttft_p50, "mean": ttft_mean}, "tpot_s": {"p99": tpot_p99},
    }  # fmt: skip


def test_sustains_needs_no_errors_and_a_median_ttft_within_target() -> None:
    assert sustains(_summary(1.0, 0.5, 0.2, 0.1))
    assert not sustains(_summary(1.0, 6.0, 0.2, 0.1))
    assert not sustains(_summary(1.0, 0.5, 0.2, 0.1, errors=1))


def test_pd_verdict_compares_at_the_highest_rate_unified_sustains() -> None:
    runs = {
        "unified": [_summary(1, 0.2, 0.10, 0.9), _summary(2, 1.0, 0.30, 0.6),
                    _summary(3, 9.0, 2.00, 0.0)],
        "disaggregated": [_summary(1, 0.3, 0.05, 0.9), _summary(2, 0.5, 0.12, 1.2),
                          _summary(3, 2.0, 0.20, 0.5)],
    }  # fmt: skip
    v = verdict(EXPERIMENTS["pd"], runs)
    assert v["rate"] == 2
    assert v["p99_tpot_unified_over_disagg"] == pytest.approx(2.5)
    assert v["goodput_disagg_over_unified"] == pytest.approx(2.0)
    assert v["target_tpot_met"] and v["target_goodput_met"]


def test_policy_verdict_is_the_mean_ttft_ratio_per_rate() -> None:
    runs = {
        "cache_aware": [_summary(1, 0, 0, 0, ttft_mean=0.5), _summary(2, 0, 0, 0, ttft_mean=1)],
        "round_robin": [_summary(1, 0, 0, 0, ttft_mean=1.0), _summary(2, 0, 0, 0, ttft_mean=4)],
    }
    v = verdict(EXPERIMENTS["policy"], runs)
    assert [(r["rate"], r["mean_ttft_rr_over_ca"], r["target_met"]) for r in v["per_rate"]] == [
        (1, 2.0, False),
        (2, 4.0, True),
    ]


def test_error_messages_are_one_clean_line() -> None:
    body = json.dumps({"error": {"message": "\x1b[36mray::D.reserve()\x1b[39m (pid=1)\n  tb"}})
    assert _error_message(body) == "ray::D.reserve() (pid=1)"
    assert _error_message("plain text") == "plain text"


def test_configs_picks_an_experiments_configurations_by_name() -> None:
    from loadgen.compare import chosen_configs

    exp = EXPERIMENTS["mooncake"]
    assert chosen_configs(exp, None) == list(exp.configs)
    picked = chosen_configs(exp, "cache_aware,ttft_pull_slack025")
    assert [c.name for c in picked] == ["cache_aware", "ttft_pull_slack025"]
    assert "--balance-slack" in picked[1].serve_args
    with pytest.raises(SystemExit, match="has no \\['nope'\\]"):
        chosen_configs(exp, "cache_aware,nope")
