"""Markdown tables from `baton bench --compare` results (what docs/performance.md shows).

    python -m loadgen.report bench/results/serving/compare_pd.json \\
        bench/results/serving/compare_policy.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

_COLUMNS = (
    "config | rate (req/s) | ok/sent | TTFT mean / p50 / p90 / p99 (s) | TPOT p50 / p90 / p99 (ms)"
    " | ITL p99 (ms) | e2e p99 (s) | out tok/s | req/s | goodput (req/s) | SLO met"
    " | prefix hit | KV share of TTFT"
)


def _f(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def table(doc: dict[str, Any]) -> str:
    lines = [f"| {_COLUMNS} |", "|" + "---|" * (_COLUMNS.count("|") + 1)]
    for name, runs in doc["runs"].items():
        for s in runs:
            t, p = s["ttft_s"], s["tpot_s"]
            lines.append(
                f"| {name} | {s['rate']:g} | {s['num_ok']}/{s['num_requests']} | "
                f"{_f(t['mean'])} / {_f(t['p50'])} / {_f(t['p90'])} / {_f(t['p99'])} | "
                f"{_f(p['p50'], 1000, 0)} / {_f(p['p90'], 1000, 0)} / {_f(p['p99'], 1000, 0)} | "
                f"{_f(s['itl_s']['p99'], 1000, 0)} | {_f(s['e2e_s']['p99'])} | "
                f"{s['output_tokens_per_s']:.1f} | {s['request_throughput']:.2f} | "
                f"{s['goodput']:.2f} | {_f(s['slo_attainment'], 100, 0)}% | "
                f"{_f(s['prefix_hit_rate'])} | {_f(s['kv_transfer_share_of_ttft'], 100, 1)}% |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="JSON", help="`baton bench --compare` results")
    for path in parser.parse_args(argv).paths:
        doc = json.loads(Path(path).read_text())
        print(f"### {doc['title']}\n\nSLO: TTFT <= {doc['slo']['ttft_s']} s, "
              f"TPOT <= {doc['slo']['tpot_s'] * 1000:.0f} ms\n")  # fmt: skip
        print(table(doc))
        print(f"\nverdict: `{json.dumps(doc.get('verdict'))}`\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
