"""`baton plan --validate` (planner/validate.py): the splits it serves are the plan's best,
with the settings the plan modelled, sent the very requests the plan replayed; and one real
validation of two splits on a tiny model."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from loadgen import cli as baton_bench
from loadgen import workloads as wl
from loadgen.schedule import fill_workload_defaults, schedules
from planner import plan as baton_plan
from planner import validate as served_splits
from planner.calibration import METRICS, Calibration

PROFILE = {
    "tp": 1, "step_ms": 2.0, "token_ms": 0.05, "chunk_tokens": 2048,
    "decode": {"decode_step_ms": 2.0, "decode_row_ms": 0.2, "decode_ctx_ms": 0.0},
    "kv_bytes_per_token": 1024,  # the tiny llama: 2 x 4 layers x 2 KV heads x 16 dims x fp32
}  # fmt: skip
WORKLOAD = ["--workload", "shared_prefix", "--system-len", "64", "--input-len", "32",
            "--tenants", "2", "--output-len", "8", "--rate", "4", "3", "--num-requests", "12",
            "--duration", "6", "--seed", "3"]  # fmt: skip


def plan_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(PROFILE))
    parser = baton_plan.build_arg_parser(argparse.ArgumentParser())
    return parser.parse_args(["--profile", str(profile), "--workers", "2", *WORKLOAD, *extra])


def test_the_served_requests_are_the_ones_the_plan_replayed(tmp_path) -> None:
    args = plan_args(tmp_path)
    fill_workload_defaults(args)
    args.rate = [3.0]
    flags = served_splits.workload_flags(args)
    bench = baton_bench.build_arg_parser(argparse.ArgumentParser()).parse_args(
        ["--url", "http://unused", *flags]
    )
    fill_workload_defaults(bench)
    space = wl.TokenSpace(16, 1000)
    ((rate, sent),) = schedules(bench, space)
    ((_, planned),) = [s for s in schedules(args, space) if s[0] == 3.0]
    assert rate == 3.0 and len(sent) == 12
    assert [(r.arrival_s, r.prompt_token_ids) for r in sent] == [
        (r.arrival_s, r.prompt_token_ids) for r in planned
    ]


def test_each_split_is_served_as_the_plan_modelled_it(tmp_path) -> None:
    args = plan_args(tmp_path, "--kv-blocks", "2048", "--max-num-seqs", "8", "--threads", "1",
                     "--serve-arg=--engine-nice", "--serve-arg=none")  # fmt: skip
    run = {"tp": 1, "prefill": 0, "decode": 2}
    serve = served_splits.serve_args(args, run, Path(args.profile[0]))
    assert serve[:6] == ["--prefill", "0", "--decode", "2", "--tp", "1"]
    assert serve[serve.index("--max-num-seqs") + 1] == "8"
    # 2048 blocks x 16 tokens x 1 kB: 32 MiB
    assert float(serve[serve.index("--kv-cache-gb") + 1]) == pytest.approx(1 / 32, rel=1e-3)
    assert serve[-2:] == ["--engine-nice", "none"]


def test_the_splits_are_ranked_best_first_at_the_first_rate() -> None:
    runs = [{"rate": 2.0, "goodput": 0.9, "ttft_p99_ms": 10.0, "prefill": 1},
            {"rate": 2.0, "goodput": 1.0, "ttft_p99_ms": 30.0, "prefill": 0},
            {"rate": 2.0, "goodput": 1.0, "ttft_p99_ms": 20.0, "prefill": 2},
            {"rate": 9.0, "goodput": 1.0, "ttft_p99_ms": 1.0, "prefill": 3}]  # fmt: skip
    assert [r["prefill"] for r in served_splits.ranked(runs)] == [2, 0, 1]


def test_each_split_is_served_k_times_taking_turns_and_ranked_by_medians(
    tmp_path, monkeypatch
) -> None:
    args = plan_args(tmp_path, "--validate", "2", "--validate-runs", "3", "--model", "m")
    fill_workload_defaults(args)
    result = {"runs": [
        {"rate": 3.0, "tp": 1, "prefill": p, "decode": d, "goodput": g, "ttft_p50_ms": 1.0,
         "ttft_p99_ms": 2.0, "itl_p50_ms": 1.0, "itl_p99_ms": 2.0}
        for p, d, g in ((1, 1, 0.9), (0, 2, 0.8))
    ]}  # fmt: skip
    served_goodput = {"1x1p1d": iter([0.5, 0.9, 0.7]), "1x0p2d": iter([0.8, 0.6, 0.95])}
    calls: list[str] = []

    async def fake_served(model_dir, serve, flags, name):  # type: ignore[no-untyped-def]
        calls.append(name)
        g = next(served_goodput[name])
        quantiles = {"p50": g, "p99": g}
        return {"slo_attainment": g, "ttft_s": quantiles, "tpot_s": quantiles,
                "num_errors": 0}, []  # fmt: skip

    monkeypatch.setattr(served_splits, "served", fake_served)
    validation = served_splits.validate(args, result)
    assert calls == ["1x1p1d", "1x0p2d"] * 3  # the splits take turns
    first, second = validation["splits"]
    assert [r["goodput"] for r in first["measured_runs"]] == [0.5, 0.9, 0.7]
    assert first["measured"]["goodput"] == 0.7 and second["measured"]["goodput"] == 0.8
    assert first["measured"]["ttft_p99_ms"] == pytest.approx(700.0)
    assert (second["measured_rank"], validation["agrees"]) == (1, False)


def test_two_splits_served_for_real_ranked_beside_the_plan(
    tiny_model_dir: Callable[..., Path], tmp_path
) -> None:
    model = tiny_model_dir("llama")
    cal = tmp_path / "cal.json"
    out = tmp_path / "plan.json"
    args = [
        "--profile", str(tmp_path / "p.json"), "--workers", "2", *WORKLOAD,
        "--kv-blocks", "1024", "--max-num-seqs", "8", "--validate", "2", "--model", str(model),
        "--serve-arg=--device", "--serve-arg=cpu", "--calibration-out", str(cal),
        "--out", str(out),
    ]  # fmt: skip
    (tmp_path / "p.json").write_text(json.dumps(PROFILE))
    assert baton_plan.main(args) == 0
    validation = json.loads(out.read_text())["validation"]
    splits = validation["splits"]
    assert [s["plan_rank"] for s in splits] == [1, 2]
    assert sorted(s["measured_rank"] for s in splits) == [1, 2]
    assert validation["agrees"] == (min(splits, key=lambda s: s["measured_rank"])["plan_rank"] == 1)
    for s in splits:
        m = s["measured"]
        assert m["lost"] == 0 and 0.0 <= m["goodput"] <= 1.0
        assert 0 < m["ttft_p50_ms"] <= m["ttft_p99_ms"] and m["itl_p50_ms"] > 0
    factors = Calibration.load(cal).factors
    assert set(factors) == set(METRICS) and all(f > 0 for f in factors.values())
