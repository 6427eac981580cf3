"""The plot is the only part of a benchmark run that needs matplotlib: without it (a GPU
host's image may lack it) the run still writes its JSON and says there is no plot."""

from __future__ import annotations

import sys

from loadgen.plot import plot_experiment, wrote

RUNS = {"baton": [{"rate": 1.0, "ttft_s": {"p50": 0.01, "p99": 0.02},
                   "tpot_s": {"p50": 0.001, "p99": 0.002}, "e2e_s": {"p99": 0.1},
                   "goodput": 1.0, "slo": {"ttft_s": 0.5, "tpot_s": 0.05}}]}  # fmt: skip


def test_a_plot_is_drawn_where_matplotlib_is_installed(tmp_path) -> None:
    png = plot_experiment("fixed", RUNS, tmp_path / "run.png")
    assert png is not None and png.stat().st_size > 0
    assert wrote(tmp_path / "run.json", png).endswith("run.png")


def test_without_matplotlib_there_is_no_plot_and_no_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # its import now raises ImportError
    assert plot_experiment("fixed", RUNS, tmp_path / "run.png") is None
    assert not (tmp_path / "run.png").exists()
    assert "no plot" in wrote(tmp_path / "run.json", None)
