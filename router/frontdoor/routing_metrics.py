"""How right the router was, as Prometheus series per worker (router.routing.accuracy
judges each routed request; `Cluster.use_metrics` has the router's `on_reuse` record here).

The error histogram has negative buckets (a worker reused more than predicted), so no sum
(OpenMetrics); the predicted and reused counters give the totals, and their ratio the
share of the predicted prefix that was there. A worker resynced for falling short counts in
`baton:router_index_resyncs_total` with the resyncs a gap in its events asks for (metrics.py).
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Histogram

_ERROR_BUCKETS = (-64, -16, -4, -1, 0, 1, 4, 16, 64)
"""Prompt blocks predicted minus reused."""


class AccuracyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.error = Histogram(
            "baton:router_prefix_prediction_error_blocks",
            "Per routed request and chosen worker: the prompt blocks the router predicted the "
            "worker would reuse (its index and promises) minus the blocks it reused.",
            ["worker"], buckets=_ERROR_BUCKETS, registry=r,
        )  # fmt: skip
        self.predicted = Counter(
            "baton:router_prefix_predicted_blocks",
            "Prompt blocks the router predicted its chosen workers would reuse.",
            ["worker"], registry=r,
        )  # fmt: skip
        self.reused = Counter(
            "baton:router_prefix_reused_blocks",
            "Prompt blocks the chosen workers reused, of the requests the router predicted.",
            ["worker"], registry=r,
        )  # fmt: skip
        self.mispredictions = Counter(
            "baton:router_prefix_mispredictions",
            "Routed requests whose chosen worker reused fewer (over) or more (under) prompt "
            "blocks than the router predicted.",
            ["worker", "direction"], registry=r,
        )  # fmt: skip
        self._workers: set[str] = set()

    def record(self, worker: str, predicted: int, reused: int) -> None:
        """One routed request's prediction on one worker, in prompt blocks."""
        error = predicted - reused
        if worker not in self._workers:  # its series show zeros from here on
            self._workers.add(worker)
            for direction in ("over", "under"):
                self.mispredictions.labels(worker=worker, direction=direction)
        self.error.labels(worker=worker).observe(error)
        self.predicted.labels(worker=worker).inc(predicted)
        self.reused.labels(worker=worker).inc(reused)
        if error:
            direction = "over" if error > 0 else "under"
            self.mispredictions.labels(worker=worker, direction=direction).inc()

    def forget(self, worker: str) -> None:
        """The worker left: its series go."""
        if worker not in self._workers:
            return
        self._workers.discard(worker)
        for metric in (self.error, self.predicted, self.reused):
            with contextlib.suppress(KeyError):
                metric.remove(worker)
        for direction in ("over", "under"):
            with contextlib.suppress(KeyError):
                self.mispredictions.remove(worker, direction)
