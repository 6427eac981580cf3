"""What one benchmark run measured, and the arithmetic that turns it into a report.

Definitions (vLLM's `benchmark_serving` conventions):
- TTFT: request sent -> first streamed token.
- TPOT: per request, (e2e - TTFT) / (output tokens - 1): the mean pace after the first token.
- ITL: every gap between two consecutive streamed chunks, pooled over all requests.
- goodput: successful requests meeting TTFT <= target and TPOT <= target, per second of run.
- prefix hit rate: cached prompt tokens / prompt tokens, from the responses' `usage`.
- KV-transfer share: seconds the cluster spent in KV transfers during the run (the
  `baton:kv_transfer_seconds` histogram's sum, scraped before and after) / the summed TTFT
  of the successful requests, the part of the latency a transfer can add to.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestResult:
    sent_s: float
    """Send time, seconds since the start of the run."""
    num_prompt_tokens: int
    ok: bool = False
    error: str = ""
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    num_cached_tokens: int = 0

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    tpot_s: float

    def met_by(self, r: RequestResult) -> bool:
        tpot = r.tpot_s
        return (
            r.ok
            and r.ttft_s is not None
            and r.ttft_s <= self.ttft_s
            and (tpot is None or tpot <= self.tpot_s)  # one token: no pace to miss
        )


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's
    default), None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


def summarize(
    results: Sequence[RequestResult],
    duration_s: float,
    slo: SLO,
    kv_transfer_s: float | None = None,
) -> dict[str, Any]:
    """The report of one run. `duration_s`: first send to last completion."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    prompt_tokens = sum(r.num_prompt_tokens for r in ok)
    cached_tokens = sum(r.num_cached_tokens for r in ok)
    output_tokens = sum(r.num_output_tokens for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    good = sum(1 for r in ok if slo.met_by(r))
    return {
        "num_requests": len(results),
        "num_ok": len(ok),
        "num_errors": len(results) - len(ok),
        "errors": errors,
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration_s,
        "output_tokens_per_s": output_tokens / duration_s,
        "goodput": good / duration_s,
        "slo_attainment": good / len(results) if results else None,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "ttft_s": distribution(ttfts),
        "tpot_s": distribution(tpots),
        "itl_s": distribution([g for r in ok for g in r.itl_s]),
        "e2e_s": distribution([r.e2e_s for r in ok if r.e2e_s is not None]),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "prefix_hit_rate": cached_tokens / prompt_tokens if prompt_tokens else None,
        "kv_transfer_s": kv_transfer_s,
        "kv_transfer_share_of_ttft": (
            kv_transfer_s / sum(ttfts) if kv_transfer_s is not None and sum(ttfts) > 0 else None
        ),
    }


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def scrape_sum(exposition: str, name: str) -> float:
    """Sum of every sample named exactly `name` (all label sets) in a Prometheus text
    exposition; 0 when absent (a server that never transferred has no samples)."""
    total = 0.0
    for line in exposition.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            total += float(m.group(3))
    return total


def scrape_by_label(exposition: str, name: str, label: str) -> dict[str, float]:
    """`label`'s value -> sample, for the samples named exactly `name` (a per-worker gauge)."""
    out: dict[str, float] = {}
    pattern = re.compile(rf'{re.escape(label)}="([^"]*)"')
    for line in exposition.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name and m.group(2) and (lm := pattern.search(m.group(2))):
            out[lm.group(1)] = float(m.group(3))
    return out


def scrape_by_labels(
    exposition: str, name: str, labels: tuple[str, ...]
) -> dict[tuple[str, ...], float]:
    """The values of `labels` -> sample, for the samples named exactly `name`."""
    out: dict[tuple[str, ...], float] = {}
    patterns = [re.compile(rf'{re.escape(label)}="([^"]*)"') for label in labels]
    for line in exposition.splitlines():
        m = _SAMPLE.match(line)
        if not (m and m.group(1) == name and m.group(2)):
            continue
        found = [p.search(m.group(2)) for p in patterns]
        if all(found):
            out[tuple(f.group(1) for f in found if f)] = float(m.group(3))
    return out
