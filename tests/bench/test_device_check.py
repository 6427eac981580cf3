"""The device check (bench/device/check.py) in its CPU dry run: every section runs the code
it runs on the GPU (the tiny model, small shapes, Triton under its interpreter, the step
graphs through their static buffers), writes its figures and the targets read them."""

from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

from bench.device import targets
from bench.device.check import SECTIONS, check, finished_earlier


def test_the_dry_run_gives_every_section_its_figures(tmp_path, capsys) -> None:
    out = tmp_path / "device_check.json"
    run = check(out, dry_run=True, budget_s=900)
    report = json.loads(out.read_text())
    assert report == json.loads(json.dumps(run.report, default=str))
    sections = report["sections"]
    assert list(sections) == [s.name for s in SECTIONS]
    assert sections["checkpoint"]["beside"] == "kernels"  # drawn while the kernels were tuned
    failed = {n: s.get("error") or s.get("skipped") for n, s in sections.items()
              if "error" in s or "skipped" in s}  # fmt: skip
    assert not failed, failed

    engine = sections["engine"]
    # Every step replayed a graph (the decode graphs or the token buckets'), none eager.
    assert engine["steps"]["eager"] == 0 and engine["steps"]["step_graph"] > 0
    for name in ("decode_b1", "decode_b64"):
        assert engine[name]["step_ms"] > 0 and engine[name]["of_floor"] > 0
        # Timed with the steps overlapped (as on a GPU) and one at a time.
        assert engine[name]["overlapped"] and engine[name]["one_at_a_time_ms"] > 0
        assert engine[name]["host_ms"] > 0
        # Profiled op by op (kernels on CUDA): the busiest, their time a step.
        profile = engine[name]["kernels"]
        assert "error" not in profile, profile
        assert profile["busy_us"] > 0 and profile["wall_us"] > 0 and profile["launches"] > 0
        assert profile["kernels"][0]["us"] >= profile["kernels"][-1]["us"] > 0
    assert "error" not in engine["prefill_64"]["kernels"]
    assert engine["syncs_in_overlapped_steps"] is None  # looked for on CUDA only
    assert engine["sampler_b1"]["batch"] == 1
    sampler = engine["sampler_b4"]  # the dry run's batch
    timed = {k: v for k, v in sampler.items() if isinstance(v, dict)}
    assert set(timed) == {"greedy", "top_k_50", "top_p_0.9_kernel", "top_p_0.9_host",
                          "top_p_0.9_seeded_kernel", "top_p_0.9_seeded_host",
                          "top_p_0.9_torch_sort"}  # fmt: skip
    assert all(v["ms"] > 0 and v["syncs"] is None for v in timed.values()), timed
    assert all(row["max_abs_err"] < 1e-3 for row in sections["kernels"]["rows"])
    # Both ways of reading keys were timed, and the faster is the table's entry, in the
    # folder the device check copies back.
    tuned = sections["kernels"]["tuning"]["rows"]["64"]
    assert {r["whole_pages"] for r in tuned if r["ms"]} == {False, True}, tuned
    assert {r["block_m"] for r in tuned if r["ms"]} == {64, 128}, tuned
    table = json.loads((tmp_path / "tuned" / "cpu_dry_run.json").read_text())
    chosen = {k: tuned[0][k] for k in ("block_n", "whole_pages", "block_m")}
    assert table["prefill"]["float32/64"].items() >= chosen.items()
    decode = sections["kernels"]["tuning"]["decode_rows"]
    assert len(decode) == 2 and all(r["score"] for r in decode), decode
    assert table["decode"]["float32/64"]["block_n"] == decode[0]["block_n"]
    assert (
        sections["gpu_suite"]["returncode"] == 0 and "collected" in sections["gpu_suite"]["summary"]
    )
    assert sections["peer"]["eager_b1"]["tokens_s"] > 0 and not sections["peer"]["timed_out"]
    assert list(sections["served"]["configs"]) == ["1p1d"]  # unified: on the device only
    runs = sections["served"]["configs"]["1p1d"]
    assert [r["rate"] for r in runs] == sections["served"]["rates"]
    assert all(r["ok"] == 3 and r["errors"] == 0 and r["ttft_p50_ms"] > 0 for r in runs)
    long_mix = sections["served"]["long_mix"]["1p1d"]
    assert [r["rate"] for r in long_mix] == sections["served"]["rates"]
    assert all(r["ok"] == 3 and r["errors"] == 0 for r in long_mix), long_mix

    # The plan is given what the 1P+1D server adds to a first token, measured on it.
    overhead = sections["served"]["request_overhead_1p1d"]
    assert overhead["local_ms"] > 0 and overhead["disagg_ms"] > 0, overhead
    assert sections["plan"]["request_overhead_ms"] == [
        str(overhead["local_ms"]), str(overhead["disagg_ms"])]  # fmt: skip
    plan = sections["plan"]["rows"]
    assert [r["rate"] for r in plan] == sections["served"]["rates"]
    assert all(r["plan_ttft_p50_ms"] > 0 and r["ttft_plan_over_served"] > 0 for r in plan)

    # Every target but the compiled peer's (no compile in the dry run) and the served
    # TTFT's (no 256-token prefill in the dry run's shapes) has its figure.
    missing = [t["what"] for t in report["targets"] if t["figure"] is None]
    assert len(missing) == 2, missing
    assert "target" in capsys.readouterr().out


def test_targets_read_the_figures_they_name() -> None:
    report = {"sections": {
        "engine": {"decode_b1": {"of_floor": 1.1}, "decode_b64": {"of_floor": 1.4},
                   "prefill_2048": {"of_matmul_rate": 0.6}, "prefill_256": {"step_ms": 10.0},
                   "short_prefill_over_decode_b1": 2.0, "offline_b1": {"tokens_s": 100.0},
                   "offline_b64": {"tokens_s": 3000.0}},
        "peer": {"compiled_b1": {"tokens_s": 120.0}, "eager_b64": {"tokens_s": 900.0},
                 "static_b64": {"error": "no"}},
        "kernels": {"rows": [{"batch": 1, "length": 4096, "triton_vs_fastest_sdpa": 0.85}]},
        "served": {"configs": {"unified": [{"ttft_p50_ms": 14.0}]}},
        "plan": {"rows": [{"rate": 1.0, "ttft_plan_over_served": 0.9,
                           "itl_plan_over_served": 1.2}]},
    }}  # fmt: skip
    held = [t["held"] for t in targets.evaluate(report)]
    # b1 held, b64 missed, prefill held, short prompt held, b1 vs compiled missed (0.83),
    # batched 3.33x held, attention held, served 4 ms over the step held, the plan's TTFT
    # 10% under the served one held, its ITL 20% over missed.
    assert held == [True, False, True, True, False, True, True, True, True, False]


def test_a_second_call_keeps_what_the_first_finished_and_runs_the_rest(tmp_path) -> None:
    work = tmp_path / "work"
    # The first call's budget covers the copy and matmul rates, not the checkpoint.
    first = check(tmp_path / "a.json", True, budget_s=40, only=["hardware", "checkpoint"],
                  work=work)  # fmt: skip
    assert first.report["sections"]["hardware"]["copy_gb_s"] > 0
    assert "skipped" in first.report["sections"]["checkpoint"]

    second = check(tmp_path / "b.json", True, budget_s=600, only=["hardware", "checkpoint"],
                   work=work, resume=True)  # fmt: skip
    hardware, made = second.report["sections"]["hardware"], second.report["sections"]["checkpoint"]
    assert hardware["kept_from"] == first.report["host"]["date"]
    assert {k: v for k, v in hardware.items() if k != "kept_from"} == json.loads(
        json.dumps(first.report["sections"]["hardware"])
    )
    assert "kept_from" not in made and (work / "checkpoint" / "config.json").exists()
    assert json.loads((tmp_path / "b.json").read_text())["sections"]["checkpoint"]["path"]

    # Without --resume, everything chosen runs again.
    third = check(tmp_path / "c.json", True, budget_s=600, only=["hardware"], work=work)
    assert "kept_from" not in third.report["sections"]["hardware"]

    # A later lease: a fresh machine (the work folder gone) resumes from the report the first
    # lease committed: its figures are kept (their first date with them), its checkpoint,
    # whose files are not there, is made again.
    shutil.rmtree(work)
    fresh = tmp_path / "fresh"
    fourth = check(tmp_path / "d.json", True, budget_s=600, only=["hardware", "checkpoint"],
                   work=fresh, resume_from=tmp_path / "b.json")  # fmt: skip
    sections = fourth.report["sections"]
    assert sections["hardware"]["kept_from"] == first.report["host"]["date"]
    assert "kept_from" not in sections["checkpoint"]
    assert (fresh / "checkpoint" / "config.json").exists()


def test_an_earlier_report_keeps_only_whole_sections_from_the_same_device(tmp_path) -> None:
    report = {
        "host": {"device": "NVIDIA H200", "date": "2026-12-08 10:00:00 UTC"},
        "sections": {
            "engine": {"decode_b1": {"step_ms": 3.9}},
            "peer": {"error": "timed out"},
            "served": {"configs": {"1p1d": []}, "partial": "unified was skipped for time"},
            "plan": {"skipped": "no served 1P+1D runs"},
            "checkpoint": {"path": str(tmp_path / "gone")},
        },
    }
    path = tmp_path / "lease_1.json"
    path.write_text(json.dumps(report))
    kept = finished_earlier(path, "NVIDIA H200")
    assert list(kept) == ["engine"]
    assert kept["engine"]["kept_from"] == "2026-12-08 10:00:00 UTC"
    assert finished_earlier(path, "NVIDIA H100 80GB HBM3") == {}  # not this card's figures
