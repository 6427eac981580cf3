"""`baton profile` on the device check's GPU and `baton plan`'s prediction of the served 1P+1D
run beside what the served section measured: the plan's TTFT and ITL p50 over the served
ones at each rate (the issue's bound: within 15%).

    baton profile --model CKPT --device cuda --dtype bfloat16 --lengths 128 512 2048
                  --batches 1 16 64 --contexts 512 2048          (the KV transfer measured too)
    baton plan --profile P --prefill 1 --decode 1 --workload fixed --input-len 256
               --output-len 64 --rate <the served rates>

The plan models the engines and the KV transfer; the serving path around them (the door, Ray
calls) is `--request-overhead-ms`, measured on the served 1P+1D server a request at a time
(the served section's `request_overhead_1p1d`). The dry run profiles the tiny model on the
CPU on small shapes, without the transfer.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.device import served as serving

SHAPES = {
    "full": ["--lengths", "128", "512", "2048", "--batches", "1", "16", "64",
             "--contexts", "512", "2048", "--repeat", "1"],
    # 32 and 256 tokens: far enough apart that the tiny model's prefill time grows by more
    # than a busy CPU's noise (16 and 64 did not always).
    "dry": ["--lengths", "32", "256", "--batches", "1", "4", "--contexts", "32", "64",
            "--repeat", "1", "--decode-steps", "2", "--no-measure-transfer"],
}  # fmt: skip
REQUESTS = {"full": "200", "dry": "20"}
TRANSFER_KEYS = ("transfer_gbps", "transfer_latency_ms", "transfer_source")


def plan_against_served(
    model_dir: Path,
    served: dict[str, Any],
    work: Path,
    dry_run: bool,
    left_s: Callable[[], float],
) -> dict[str, Any]:
    runs = (served.get("configs") or {}).get("1p1d")
    if not isinstance(runs, list):  # its profile would take the device for nothing
        return {"skipped": "no served 1P+1D runs to hold the plan against"}
    kind = "dry" if dry_run else "full"
    device = serving.device_flags(dry_run)
    profile = work / "profile.json"
    # `baton profile` and `baton plan` by their modules: the device runs the tree uninstalled.
    serving.run_tool(
        [sys.executable, "-m", "planner.profile", "--model", str(model_dir), *device,
         *SHAPES[kind], "--out", str(profile)],
        timeout_s=max(30.0, left_s() - 40),
    )  # fmt: skip
    rates = [str(r) for r in served.get("rates", [])] or serving.RATES[kind]
    plan_out = work / "plan_1p1d.json"
    overhead = served.get("request_overhead_1p1d") or {}
    measured_overhead = "local_ms" in overhead and "disagg_ms" in overhead
    overhead_flag = (["--request-overhead-ms", str(overhead["local_ms"]),
                      str(overhead["disagg_ms"])] if measured_overhead else [])  # fmt: skip
    serving.run_tool(
        [sys.executable, "-m", "planner.plan", "--profile", str(profile), "--prefill", "1",
         "--decode", "1", *serving.WORKLOAD, "--rate", *rates, "--num-requests",
         REQUESTS[kind], *overhead_flag, "--out", str(plan_out)],
        timeout_s=max(30.0, left_s() - 10),
    )  # fmt: skip
    profiled = json.loads(profile.read_text())
    planned = json.loads(plan_out.read_text())["runs"]
    measured = {r["rate"]: r for r in runs}
    rows = []
    for plan in planned:
        row = {"rate": plan["rate"], "plan_ttft_p50_ms": plan["ttft_p50_ms"],
               "plan_itl_p50_ms": plan["itl_p50_ms"]}  # fmt: skip
        run = measured.get(plan["rate"])
        if run:
            row["served_ttft_p50_ms"] = run["ttft_p50_ms"]
            row["served_itl_p50_ms"] = run["itl_p50_ms"]
            row["ttft_plan_over_served"] = _ratio(plan["ttft_p50_ms"], run["ttft_p50_ms"])
            row["itl_plan_over_served"] = _ratio(plan["itl_p50_ms"], run["itl_p50_ms"])
        rows.append(row)
    return {
        "profile": str(profile),
        "transfer": {k: profiled.get(k) for k in TRANSFER_KEYS},
        "request_overhead_ms": overhead_flag[1:] or "not measured: none modelled",
        "rows": rows,
        "served_from": served.get("kept_from", "this call's served section"),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b
