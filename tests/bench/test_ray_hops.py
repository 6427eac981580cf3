"""bench/serving/ray_hops.py (in a process of its own: it starts and ends a Ray of its
own): both hops measured idle and beside the load."""

from __future__ import annotations

import json
import subprocess
import sys


def test_a_short_run_measures_both_hops_both_ways(tmp_path) -> None:
    out = tmp_path / "ray_hops.json"
    command = [sys.executable, "-m", "bench.serving.ray_hops", "--calls", "10", "--out", str(out),
               "--cpu", "this host"]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    for name in ("idle", "beside_a_load_on_every_core"):
        for hop in ("call_round_trip_ms", "streamed_item_ms"):
            assert 0 < report[name][hop]["p50"] <= report[name][hop]["p90"]
    assert "| idle |" in run.stdout
