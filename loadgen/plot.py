"""One PNG per experiment: latency percentiles and goodput against request rate, one line
per configuration (matplotlib, headless). Where matplotlib is not installed (a GPU host
whose image lacks it) there is no plot: every figure is in the run's JSON all the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_PANELS = (
    ("ttft_s", "p50", "TTFT p50 (s)"),
    ("ttft_s", "p99", "TTFT p99 (s)"),
    ("tpot_s", "p50", "TPOT p50 (s)"),
    ("tpot_s", "p99", "TPOT p99 (s)"),
    ("e2e_s", "p99", "e2e p99 (s)"),
    ("goodput", None, "goodput (req/s meeting SLO)"),
)


def plot_experiment(
    title: str, runs: Mapping[str, Sequence[Mapping[str, Any]]], path: Path
) -> Path | None:
    """`runs`: configuration name -> its summaries, each with a `rate` key. The goodput
    targets (each summary's `slo`) are drawn as dashed lines on the TTFT and TPOT panels.
    None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7), constrained_layout=True)
    for ax, (metric, stat, label) in zip(axes.flat, _PANELS, strict=True):
        for name, summaries in runs.items():
            pts = sorted(
                (s["rate"], v)
                for s in summaries
                if (v := (s[metric][stat] if stat else s[metric])) is not None
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        slo = next((s["slo"] for ss in runs.values() for s in ss), None)
        if slo and metric in ("ttft_s", "tpot_s"):
            ax.axhline(slo[metric], color="grey", linestyle="--", linewidth=1, label="SLO")
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
        if metric != "goodput":
            ax.set_yscale("log")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def wrote(out: Path, png: Path | None) -> str:
    """What a run wrote, for its last line."""
    return f"wrote {out} and {png}" if png else f"wrote {out} (no plot: matplotlib is missing)"
