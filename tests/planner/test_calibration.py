"""A calibration (planner/calibration.py): the largest measured / planned ratio of each
latency figure, applied to a plan's figures and its goodput, and `baton plan --calibration`."""

from __future__ import annotations

import argparse
import json

import pytest

from planner import plan as baton_plan
from planner.calibration import METRICS, Calibration


def figures(ttft: float, itl: float) -> dict[str, float]:
    return {"ttft_p50_ms": ttft, "ttft_p99_ms": 2 * ttft, "itl_p50_ms": itl, "itl_p99_ms": 2 * itl}


def test_a_p50_takes_the_most_pessimistic_run_and_a_p99_the_median_one() -> None:
    planned = figures(100.0, 10.0)
    measured = [figures(120.0, 9.0), figures(150.0, 11.0), figures(130.0, 10.0)]
    measured[1]["ttft_p99_ms"] = 2000.0  # one run's few slowest requests: an outlier
    cal = Calibration.from_runs([(planned, m) for m in measured], "three runs")
    assert cal.factors == {"ttft_p50": 1.5, "ttft_p99": 1.3, "itl_p50": 1.1, "itl_p99": 1.0}
    assert cal.runs == 3


def test_applied_figures_scale_and_goodput_is_recounted_pessimistically() -> None:
    cal = Calibration({"ttft_p50": 1.2, "ttft_p99": 2.0, "itl_p50": 1.0, "itl_p99": 1.5}, "t")
    records = [{"ttft_ms": 400.0, "itl_ms": 50.0}, {"ttft_ms": 900.0, "itl_ms": 50.0},
               {"ttft_ms": 100.0, "itl_ms": 80.0}]  # fmt: skip
    summary = {**figures(500.0, 50.0), "goodput": 1.0, "requests": 3}
    out = cal.apply(summary, records, ttft_slo_ms=1000.0, itl_slo_ms=100.0)
    assert out["ttft_p50_ms"] == pytest.approx(600.0) and out["ttft_p99_ms"] == 2000.0
    assert out["model_ttft_p50_ms"] == 500.0 and out["model_goodput"] == 1.0
    # TTFT x2 (the larger factor): 900 ms misses; ITL x1.5: 80 ms misses.
    assert out["goodput"] == pytest.approx(1 / 3)


def test_a_calibration_file_round_trips_and_a_bad_one_names_its_field(tmp_path) -> None:
    path = tmp_path / "cal.json"
    Calibration(dict.fromkeys(METRICS, 1.25), "here", 3).save(path)
    assert Calibration.load(path) == Calibration(dict.fromkeys(METRICS, 1.25), "here", 3)
    path.write_text(json.dumps({"factors": {**dict.fromkeys(METRICS, 1.0), "itl_p99": -1}}))
    with pytest.raises(ValueError, match=r"factors\.itl_p99"):
        Calibration.load(path)
    path.write_text(json.dumps({"factors": {"ttft_p50": 1.0}}))
    with pytest.raises(ValueError, match="itl_p99"):
        Calibration.load(path)


def test_the_plan_reads_a_calibration_and_keeps_the_models_own_figures(tmp_path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({
        "step_ms": 10.0, "token_ms": 1.0, "chunk_tokens": 4096,
        "decode": {"decode_step_ms": 5.0, "decode_row_ms": 1.0, "decode_ctx_ms": 0.0},
    }))  # fmt: skip
    cal = tmp_path / "cal.json"
    Calibration(dict.fromkeys(METRICS, 3.0), "test").save(cal)
    flags = [
        "--profile",
        str(profile),
        "--prefill",
        "1",
        "--decode",
        "1",
        "--workload",
        "fixed",
        "--input-len",
        "256",
        "--output-len",
        "16",
        "--rate",
        "1",
        "--num-requests",
        "10",
    ]
    parser = baton_plan.build_arg_parser(argparse.ArgumentParser())
    plain = baton_plan.plan(parser.parse_args(flags))["runs"][0]
    calibrated = baton_plan.plan(parser.parse_args([*flags, "--calibration", str(cal)]))
    run = calibrated["runs"][0]
    assert run["ttft_p99_ms"] == pytest.approx(3 * plain["ttft_p99_ms"])
    assert run["model_itl_p50_ms"] == pytest.approx(plain["itl_p50_ms"])
    assert calibrated["calibration"]["factors"]["ttft_p50"] == 3.0


def test_plan_refuses_flags_it_cannot_use_naming_them(tmp_path, capsys) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"step_ms": 1.0, "token_ms": 1.0, "chunk_tokens": 64,
                                   "decode": {"decode_step_ms": 1.0, "decode_row_ms": 1.0,
                                              "decode_ctx_ms": 0.0}}))  # fmt: skip
    assert baton_plan.main(["--profile", str(profile), "--validate", "2"]) == 2
    assert "--validate needs --model" in capsys.readouterr().err
    assert baton_plan.main(["--profile", str(profile), "--calibration-out", "x.json"]) == 2
    assert "--calibration-out needs --validate" in capsys.readouterr().err
    assert baton_plan.main(["--profile", str(tmp_path / "none.json"), "--prefill", "1"]) == 2
    assert "none.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        baton_plan.main(["--profile", str(profile), "--decode", "0"])
    assert "--decode" in capsys.readouterr().err
