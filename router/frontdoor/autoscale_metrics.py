"""The autoscaler's decision as Prometheus gauges, one series per pool: every input the
decision reads (router/cluster/autoscale/policy.py: the pool's signals, each pressure term,
its bounds and the capacity per worker the scale-down check divides by) beside what it
decided (current and target workers, pressure).

The front door copies the controller's latest decision per pool into them on each scrape
(`record`), so a graph of `baton:autoscale_pressure_term` next to
`baton:autoscale_target_workers` shows why a pool moved.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

__all__ = ["SIGNAL_GAUGES", "AutoscaleGauges"]

SIGNAL_GAUGES = (
    ("ready", "autoscale_ready_workers", "Ready workers the autoscaler counted."),
    ("starting", "autoscale_starting_workers", "Workers still starting (counted in the size)."),
    ("queued", "autoscale_queued_requests", "Requests queued for the pool (engines + doors)."),
    ("oldest_wait_s", "autoscale_oldest_wait_seconds", "Longest wait of a queued request."),
    ("ttft_p90_s", "autoscale_ttft_p90_seconds", "TTFT p90 of the prompts the pool computed."),
    ("itl_p90_s", "autoscale_itl_p90_seconds", "ITL p90 over the doors' recent window."),
    ("kv_usage", "autoscale_kv_usage_perc", "Mean share of the workers' KV blocks in use."),
    ("batch_usage", "autoscale_batch_usage_perc", "Mean share of running-request slots used."),
    ("batch_growth_per_s", "autoscale_batch_growth_per_second", "Slope of the batch usage."),
    ("busy", "autoscale_busy_perc", "Mean share of wall time the workers spent stepping."),
    ("tokens_per_s", "autoscale_tokens_per_second", "Prompt tokens + decode rows a second."),
)
"""(PoolSignals field, metric name after `baton:`, help) of each signal gauge. A signal
with no value (no request finished lately: no TTFT p90) has no sample."""


def term_label(term: str) -> str:
    """A pressure term's name as a label value: "TTFT p90" -> "ttft_p90"."""
    return re.sub(r"[^a-z0-9]+", "_", term.lower()).strip("_")


class AutoscaleGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(f"baton:{name}", doc, ["pool", *labels], registry=registry)

        self.signals = {
            field: gauge(name, doc + " (autoscaler input)") for field, name, doc in SIGNAL_GAUGES
        }
        self.current = gauge("autoscale_current_workers", "A pool's size when last evaluated.")
        self.target = gauge("autoscale_target_workers", "The autoscaler's latest size for a pool.")
        self.pressure = gauge(
            "autoscale_pressure",
            "A pool's distance to its SLO budget at the autoscaler's last evaluation (1: at it).",
        )
        self.terms = gauge(
            "autoscale_pressure_term",
            "One term of a pool's pressure (the pressure is the largest; 1: at its target).",
            "term",
        )
        self.min_workers = gauge("autoscale_min_workers", "The fewest workers a pool may have.")
        self.max_workers = gauge("autoscale_max_workers", "The most workers a pool may have.")
        self.capacity = gauge(
            "autoscale_capacity_tokens_per_second",
            "Most tokens a second one worker of the pool carried while saturated "
            "(the scale-down check's divisor); no sample before it was seen.",
        )
        self.evaluated_at = gauge(
            "autoscale_last_evaluation_timestamp_seconds",
            "Unix time of the autoscaler's latest evaluation of a pool.",
        )
        self._terms_seen: dict[str, set[str]] = {}

    def record(self, pool: str, decision: Mapping[str, Any]) -> None:
        """Copy one decision (router.cluster.autoscale.policy.Decision as a dict)."""
        signals = decision.get("signals", {})
        for field, gauge in self.signals.items():
            self._set_or_clear(gauge, pool, signals.get(field))
        self.current.labels(pool=pool).set(decision["size"])
        self.target.labels(pool=pool).set(decision["target"])
        self.pressure.labels(pool=pool).set(decision["pressure"])
        terms = {term_label(t): v for t, v in decision.get("terms", {}).items()}
        for gone in self._terms_seen.get(pool, set()) - terms.keys():
            with contextlib.suppress(KeyError):
                self.terms.remove(pool, gone)
        self._terms_seen[pool] = set(terms)
        for term, value in terms.items():
            self.terms.labels(pool=pool, term=term).set(value)
        self._set_or_clear(self.min_workers, pool, decision.get("min_size"))
        self._set_or_clear(self.max_workers, pool, decision.get("max_size"))
        self._set_or_clear(self.capacity, pool, decision.get("capacity_per_worker"))
        self.evaluated_at.labels(pool=pool).set(decision["at"])

    @staticmethod
    def _set_or_clear(gauge: Gauge, pool: str, value: float | None) -> None:
        if value is None:
            with contextlib.suppress(KeyError):
                gauge.remove(pool)
        else:
            gauge.labels(pool=pool).set(value)
