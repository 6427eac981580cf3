"""What served runs showed the cluster model lacks, as factors on its latencies: `baton plan
--calibration FILE`.

    baton plan ... --validate 3 --model /ckpt --calibration-out cal.json  # served runs -> cal.json
    baton plan ... --calibration cal.json                                  # plans with it

The model (planner/sim/cluster.py) prices the engine steps a profile measured on an idle
host; a served cluster adds what no profile of one engine holds: the front door, Ray's
calls and the output streams share the host's cores with the engines, and queues amplify
every millisecond of that under bursts. On a 2-vCPU host the model's TTFT and time per
output token run 0.54-0.94 of the served runs' (docs/performance.md, "Planning"), an
optimistic plan that under-provisions. A calibration is measured / planned for each
latency figure (TTFT and ITL at p50 and p99) over the runs it was taken from: for a p50 the
*largest* ratio (a p50 moves little from run to run, so the largest is a small margin and a
plan that errs, errs on the pessimistic side), for a p99 the median ratio (a p99 is a run's
few slowest requests: on a shared host one run's can be ten times another's, and the largest
would carry that one outlier into every plan). The ratios come from runs of the
cluster being planned, on its own traffic, as an operator's running cluster gives them
(NVIDIA Dynamo's SLA planner corrects its interpolated latencies the same way).

Applying it: each figure is multiplied by its factor; goodput is recounted with every
request's TTFT and ITL multiplied by the larger of that metric's two factors (the
pessimistic reading of where in the distribution a request falls). The uncalibrated figures
stay beside them (`model_*`), so a calibration never hides what the model itself says.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
"""The plan's latency figures, as `baton plan` names them (`<metric>_ms`)."""


@dataclass(frozen=True)
class Calibration:
    factors: dict[str, float]
    """measured / planned for each of METRICS."""
    source: str
    """Which runs the factors come from (a command, a file, a date)."""
    runs: int = 1

    @classmethod
    def from_runs(cls, pairs: list[tuple[dict, dict]], source: str) -> Calibration:
        """From (planned, measured) pairs, each `{<metric>_ms: value}`: the largest ratio of
        each p50 over the pairs, the median ratio of each p99."""
        if not pairs:
            raise ValueError("a calibration needs at least one served run")
        factors = {}
        for m in METRICS:
            ratios = [ms[f"{m}_ms"] / p[f"{m}_ms"] for p, ms in pairs if p[f"{m}_ms"] > 0]
            pick = max if m.endswith("p50") else statistics.median
            factors[m] = round(pick(ratios), 3) if ratios else 1.0
        return cls(factors, source, len(pairs))

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        raw = json.loads(Path(path).read_text())
        factors = raw.get("factors")
        if not isinstance(factors, dict) or set(factors) != set(METRICS):
            raise ValueError(f"{path}: `factors` must give {', '.join(METRICS)}")
        for m, f in factors.items():
            if not isinstance(f, (int, float)) or f <= 0:
                raise ValueError(f"{path}: factors.{m} must be a positive number, not {f!r}")
        return cls({m: float(f) for m, f in factors.items()}, str(raw.get("source", path)),
                   int(raw.get("runs", 1)))  # fmt: skip

    def save(self, path: str | Path) -> None:
        doc = {"factors": self.factors, "source": self.source, "runs": self.runs}
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")

    def apply(self, summary: dict[str, Any], records: list[dict[str, Any]],
              ttft_slo_ms: float, itl_slo_ms: float) -> dict[str, Any]:  # fmt: skip
        """`summary` (planner.sim.cluster.summarize of `records`) with its figures calibrated
        and the uncalibrated ones kept as `model_<figure>`."""
        out = dict(summary)
        for m in METRICS:
            out[f"model_{m}_ms"] = summary[f"{m}_ms"]
            out[f"{m}_ms"] = summary[f"{m}_ms"] * self.factors[m]
        ttft = max(self.factors["ttft_p50"], self.factors["ttft_p99"])
        itl = max(self.factors["itl_p50"], self.factors["itl_p99"])
        good = sum(
            1
            for r in records
            if r["ttft_ms"] * ttft <= ttft_slo_ms
            and (r.get("itl_ms") is None or r["itl_ms"] * itl <= itl_slo_ms)
        )
        out["model_goodput"] = summary["goodput"]
        out["goodput"] = good / len(records) if records else 0.0
        return out
