"""bench/engine/host_step.py: every phase of a decode step at batch 1 and 64, the host's
part their sum, the run's JSON and table."""

from __future__ import annotations

import json

from bench.engine import host_step


def test_a_short_run_writes_every_phase(tmp_path, tiny_model_dir, monkeypatch, capsys) -> None:
    monkeypatch.setattr(host_step, "MODEL", tiny_model_dir("llama"))
    out = tmp_path / "host_step.json"
    host_step.main(["--steps", "2", "--runs", "1", "--out", str(out), "--cpu", "this host"])
    report = json.loads(out.read_text())
    assert report["cpu"] == "this host"
    for batch in (1, 64):
        r = report[f"decode_b{batch}"]
        assert r["step_us"] > 0 and r["forward_us"] > 0 and r["schedule_us"] > 0
        host = r["schedule_us"] + r["layout_us"] + r["output_us"]
        assert abs(r["host_us"] - host) < 1e-6 and r["runs_host_us"] == [r["host_us"]]
    assert "| 64 |" in capsys.readouterr().out
