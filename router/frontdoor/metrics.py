"""Prometheus metrics of the front doors and the cluster, named in vLLM's style
(`baton:time_to_first_token_seconds`, ...).

One `Metrics` object owns its own `CollectorRegistry`, so several servers (or tests) in one
process never clash. The front doors record requests (`observe_request`); the request path
and controller call `record_worker`, `record_kv_transfer`, `record_kv_transfer_failure`,
`record_index_resync`, `set_pool_size`, `record_autoscale` (autoscale_metrics.py) and
`record_router_decision`. `baton:worker_pool{worker, pool}` (always 1) names each worker's
pool, so per-worker series sum per pool with `* on (worker) group_left (pool)`.
Per-tenant series live in tenant_metrics.py. `LiveStats` keeps the short per-second history
the dashboard charts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics import exposition as openmetrics

from core.step_stats import PHASES
from router.frontdoor.autoscale_metrics import AutoscaleGauges
from router.frontdoor.routing_metrics import AccuracyMetrics
from router.frontdoor.slo_window import SloWindow
from router.frontdoor.tenant_metrics import TenantMetrics

__all__ = ["CONTENT_TYPE_LATEST", "LiveStats", "Metrics", "RequestRecord"]

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
_ACCEPTANCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_TPOT_BUCKETS = (
    0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
_EXEMPLAR_ID_LEN = 100
OUTCOMES = ("success", "invalid", "overloaded", "deadline", "failed", "cancelled")


STEP_TOKEN_KINDS = (
    ("decode", "decode_rows"),
    ("prefill", "prefill_tokens"),
    ("draft", "draft_tokens"),
    ("draft_accepted", "accepted_tokens"),
)
"""`baton:worker_step_tokens_total{kind}` and the StepTotals field each counts."""
OFFLOAD_OPS = (
    ("spilled", "spilled_blocks"),
    ("restored", "restored_blocks"),
    ("swapped", "swapped_blocks"),
)
"""`baton:worker_kv_offload_blocks_total{op}` and the StepTotals field each counts."""


@dataclass(frozen=True)
class RequestRecord:
    """One finished (or failed) request, as the front door saw it."""

    outcome: str
    """One of OUTCOMES."""
    ttft_s: float | None = None
    e2e_s: float | None = None
    queue_s: float | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    tenant: str = ""
    prefilled_by: str = ""
    """The pool that computed the prompt when another decoded it (core.request.RequestProgress)."""
    request_id: str = ""
    """Attached to the latency observations as an OpenMetrics exemplar: a slow bucket
    names a request that landed in it (X-Request-Id leads the id), without a label per
    request."""

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.ttft_s is None or self.e2e_s is None or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.slo = SloWindow()
        """Recent TTFT / ITL percentiles, which this door reports to the autoscaler."""

        def seconds(
            name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS
        ) -> Histogram:
            return Histogram(f"baton:{name}_seconds", doc, buckets=buckets, registry=r)

        self.ttft = seconds("time_to_first_token", "Time to first token.")
        self.tpot = seconds(
            "time_per_output_token", "Time per output token after the first.", _TPOT_BUCKETS
        )
        self.e2e = seconds("e2e_request_latency", "End-to-end request latency.")
        self.queue = seconds("request_queue_time", "Time a request waited before it was scheduled.")
        self.requests = Counter("baton:requests", "Requests by outcome.", ["outcome"], registry=r)
        self.tenants = TenantMetrics(r, _LATENCY_BUCKETS)
        self.draft_acceptance = Histogram(
            "baton:request_draft_acceptance_rate",
            "Per request that speculated: accepted / drafted tokens (--speculative).",
            buckets=_ACCEPTANCE_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter("baton:prompt_tokens", "Prompt tokens.", registry=r)
        self.generation_tokens = Counter("baton:generation_tokens", "Generated tokens.", registry=r)
        self.cached_tokens = Counter(
            "baton:prefix_cache_hit_tokens", "Prompt tokens served from a prefix cache.",
            registry=r,
        )  # fmt: skip
        self.running = Gauge(
            "baton:num_requests_running", "Requests running on a worker.", ["worker"],
            registry=r,
        )  # fmt: skip
        self.waiting = Gauge(
            "baton:num_requests_waiting", "Requests waiting on a worker.", ["worker"],
            registry=r,
        )  # fmt: skip
        self.kv_usage = Gauge(
            "baton:kv_cache_usage_perc", "Fraction of a worker's KV blocks in use (0..1).",
            ["worker"], registry=r,
        )  # fmt: skip
        self.kv_blocks = Gauge(
            "baton:num_kv_blocks", "KV blocks of a worker by state (used / free).",
            ["worker", "state"], registry=r,
        )  # fmt: skip
        self.prefix_hit_rate = Gauge(
            "baton:prefix_cache_hit_rate", "Cached prompt tokens / prompt tokens per worker.",
            ["worker"], registry=r,
        )  # fmt: skip
        self.prefix_pulled_tokens = Counter(
            "baton:prefix_pulled_tokens",
            "Prompt tokens a prefill worker copied from a peer's cache instead of computing.",
            registry=r,
        )  # fmt: skip
        self.kv_transfer_bytes = Counter(
            "baton:kv_transfer_bytes", "KV cache bytes moved between workers.", registry=r
        )
        self.kv_transfer_seconds = seconds("kv_transfer", "Duration of one request's KV transfer.")
        self.kv_transfer_failures = Counter(
            "baton:kv_transfer_failures",
            "KV handoffs that failed: the prompt's KV did not land in the decode worker's "
            "reservation (transfer error, timeout, or the decode worker lost).",
            registry=r,
        )  # fmt: skip
        self.index_resyncs = Counter(
            "baton:router_index_resyncs",
            "Times the router re-read a worker's whole cache into its prefix index: the "
            "index missed the worker's KV events (a gap in their sequence), or the worker "
            "kept reusing fewer blocks than its events said it held.",
            ["worker"], registry=r,
        )  # fmt: skip
        self.worker_steps = Counter(
            "baton:worker_steps", "Engine steps a worker ran.", ["worker"], registry=r
        )
        self.worker_overlapped_steps = Counter(
            "baton:worker_overlapped_steps", "Engine steps a worker launched while the step "
            "before was still on the device (overlapped steps).", ["worker"], registry=r,
        )  # fmt: skip
        self.worker_step_seconds = Counter(
            "baton:worker_step_seconds",
            "Time a worker's engine steps spent, by phase (attention is part of forward).",
            ["worker", "phase"], registry=r,
        )  # fmt: skip
        self.worker_step_tokens = Counter(
            "baton:worker_step_tokens",
            "Tokens a worker's steps computed: decode rows and prompt-chunk tokens.",
            ["worker", "kind"], registry=r,
        )  # fmt: skip
        self.worker_offload_blocks = Counter(
            "baton:worker_kv_offload_blocks",
            "KV blocks a worker moved through its offload tiers: spilled to host memory, "
            "restored on a prefix hit, swapped out by a preemption.",
            ["worker", "op"], registry=r,
        )  # fmt: skip
        self._step_totals: dict[str, dict[str, float]] = {}
        """worker -> the totals it last reported (the counters grow by the difference)."""
        self.pool_size = Gauge("baton:pool_size", "Workers in a pool.", ["pool"], registry=r)
        self.worker_pool = Gauge(
            "baton:worker_pool", "1 for each worker, labelled with its pool.",
            ["worker", "pool"], registry=r,
        )  # fmt: skip
        self._pools: dict[str, str] = {}
        """worker -> the pool its `worker_pool` series names."""
        self.autoscale = AutoscaleGauges(r)
        self.router_decisions = Counter(
            "baton:router_decisions", "Routing decisions by policy.", ["policy"], registry=r
        )
        self.accuracy = AccuracyMetrics(r)
        """How right the router was, per worker (router.routing.accuracy)."""
        for outcome in OUTCOMES:  # show zeros before the first request
            self.requests.labels(outcome=outcome)
        self.live = LiveStats()
        self.known_workers: set[str] = set()
        """Workers with series; `forget_worker` removes one."""

    # -- front doors -------------------------------------------------------------------
    def observe_request(self, rec: RequestRecord) -> None:
        self.requests.labels(outcome=rec.outcome).inc()
        self.slo.add(rec.ttft_s, rec.tpot_s, rec.prefilled_by)
        self.prompt_tokens.inc(rec.num_prompt_tokens)
        self.generation_tokens.inc(rec.num_output_tokens)
        self.cached_tokens.inc(rec.num_cached_tokens)
        if rec.num_draft_tokens:
            self.draft_acceptance.observe(rec.num_accepted_tokens / rec.num_draft_tokens)
        # OpenMetrics caps an exemplar's labels at 128 characters.
        exemplar = {"request_id": rec.request_id[:_EXEMPLAR_ID_LEN]} if rec.request_id else None
        for hist, value in (
            (self.ttft, rec.ttft_s),
            (self.tpot, rec.tpot_s),
            (self.e2e, rec.e2e_s),
            (self.queue, rec.queue_s),
        ):
            if value is not None:
                hist.observe(value, exemplar)
        self.tenants.observe(rec.tenant, rec.ttft_s, rec.num_prompt_tokens, rec.num_output_tokens)
        self.live.add(rec)

    # -- request path / cluster state ---------------------------------------------------
    def record_worker(
        self,
        worker_id: str,
        *,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        prefix_hit_rate: float,
        num_used_blocks: int | None = None,
        num_free_blocks: int | None = None,
        steps: dict[str, float] | None = None,
        pool: str | None = None,
    ) -> None:
        if worker_id not in self.known_workers:
            self.known_workers.add(worker_id)
            self.index_resyncs.labels(worker=worker_id)  # a zero from the first report on
        if pool is not None and self._pools.get(worker_id) != pool:
            self._forget_pool(worker_id)
            self._pools[worker_id] = pool
            self.worker_pool.labels(worker=worker_id, pool=pool).set(1)
        self.running.labels(worker=worker_id).set(num_running)
        self.waiting.labels(worker=worker_id).set(num_waiting)
        self.kv_usage.labels(worker=worker_id).set(kv_usage)
        self.prefix_hit_rate.labels(worker=worker_id).set(prefix_hit_rate)
        if num_used_blocks is not None:
            self.kv_blocks.labels(worker=worker_id, state="used").set(num_used_blocks)
        if num_free_blocks is not None:
            self.kv_blocks.labels(worker=worker_id, state="free").set(num_free_blocks)
        if steps:
            self._record_steps(worker_id, steps)

    def _record_steps(self, worker_id: str, steps: dict[str, float]) -> None:
        """Grow the step counters by what the worker's totals grew since its last report
        (all of them when it restarted and its totals went down)."""
        last = self._step_totals.get(worker_id, {})
        if steps.get("steps", 0) < last.get("steps", 0):
            last = {}
        self._step_totals[worker_id] = dict(steps)

        def grown(key: str) -> float:
            return max(0.0, steps.get(key, 0) - last.get(key, 0))

        self.worker_steps.labels(worker=worker_id).inc(grown("steps"))
        self.worker_overlapped_steps.labels(worker=worker_id).inc(grown("overlapped_steps"))
        for kind, key in STEP_TOKEN_KINDS:
            self.worker_step_tokens.labels(worker=worker_id, kind=kind).inc(grown(key))
        if any(steps.get(key) for _, key in OFFLOAD_OPS):  # only workers whose tiers moved
            for op, key in OFFLOAD_OPS:
                self.worker_offload_blocks.labels(worker=worker_id, op=op).inc(grown(key))
        for phase in PHASES:
            self.worker_step_seconds.labels(worker=worker_id, phase=phase).inc(grown(f"{phase}_s"))

    def forget_worker(self, worker_id: str) -> None:
        """Drop a removed worker's series (so dashboards don't show it forever)."""
        self.known_workers.discard(worker_id)
        self._forget_pool(worker_id)
        with contextlib.suppress(KeyError):
            self.index_resyncs.remove(worker_id)
        for gauge in (self.running, self.waiting, self.kv_usage, self.prefix_hit_rate):
            with contextlib.suppress(KeyError):
                gauge.remove(worker_id)
        for state in ("used", "free"):
            with contextlib.suppress(KeyError):
                self.kv_blocks.remove(worker_id, state)
        self.accuracy.forget(worker_id)
        if self._step_totals.pop(worker_id, None) is not None:
            for counter in (self.worker_steps, self.worker_overlapped_steps):
                with contextlib.suppress(KeyError):
                    counter.remove(worker_id)
            for kind, _ in STEP_TOKEN_KINDS:
                with contextlib.suppress(KeyError):
                    self.worker_step_tokens.remove(worker_id, kind)
            for op, _ in OFFLOAD_OPS:
                with contextlib.suppress(KeyError):
                    self.worker_offload_blocks.remove(worker_id, op)
            for phase in PHASES:
                with contextlib.suppress(KeyError):
                    self.worker_step_seconds.remove(worker_id, phase)

    def _forget_pool(self, worker_id: str) -> None:
        pool = self._pools.pop(worker_id, None)
        if pool is not None:
            with contextlib.suppress(KeyError):
                self.worker_pool.remove(worker_id, pool)

    def record_prefix_pull(self, num_tokens: int) -> None:
        self.prefix_pulled_tokens.inc(num_tokens)

    def record_kv_transfer(self, num_bytes: int, seconds: float) -> None:
        self.kv_transfer_bytes.inc(num_bytes)
        self.kv_transfer_seconds.observe(seconds)

    def set_pool_size(self, pool: str, size: int) -> None:
        self.pool_size.labels(pool=pool).set(size)

    def record_kv_transfer_failure(self) -> None:
        self.kv_transfer_failures.inc()

    def record_index_resync(self, worker_id: str) -> None:
        self.index_resyncs.labels(worker=worker_id).inc()

    def record_autoscale(self, pool: str, decision: dict[str, Any]) -> None:
        """The autoscaler's latest decision for `pool` and every input it read."""
        self.autoscale.record(pool, decision)

    def record_router_decision(self, policy: str) -> None:
        self.router_decisions.labels(policy=policy).inc()

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """(body, content type): OpenMetrics, exemplars included, when `accept` (the
        scraper's Accept header) asks for it, as Prometheus does with exemplar storage on;
        else the classic text format."""
        self.tenants.refresh()
        if "application/openmetrics-text" in accept:
            # Names printed as they are: the default escaping turns the colon into `_` in
            # the samples but not in their family's HELP/TYPE lines (prometheus_client
            # 0.26), which a parser rejects. Colons are valid OpenMetrics names.
            body = openmetrics.generate_latest(self.registry, escaping=openmetrics.ALLOWUTF8)
            return body, openmetrics.CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class LiveStats:
    """Per-second buckets of the last `window_s` seconds, for the dashboard's charts.

    Thread-safe: gRPC and HTTP handlers may record from different threads.
    """

    def __init__(self, window_s: int = 300, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        # second -> [requests, ttft_sum, ttft_n, tpot_sum, tpot_n, output_tokens]
        self._buckets: deque[tuple[int, list[float]]] = deque()

    def add(self, rec: RequestRecord) -> None:
        now = int(self._clock())
        with self._lock:
            if not self._buckets or self._buckets[-1][0] != now:
                self._buckets.append((now, [0.0] * 6))
            b = self._buckets[-1][1]
            b[0] += 1
            if rec.ttft_s is not None:
                b[1] += rec.ttft_s
                b[2] += 1
            if rec.tpot_s is not None:
                b[3] += rec.tpot_s
                b[4] += 1
            b[5] += rec.num_output_tokens
            self._trim(now)

    def snapshot(self) -> dict[str, list[float | None] | list[float] | list[int]]:
        """Columns over the window, one entry per second that saw a finished request:
        `t` (unix seconds), mean `ttft_s`, mean `tpot_s`, `tokens_per_s`, `requests`."""
        with self._lock:
            self._trim(int(self._clock()))
            rows = list(self._buckets)
        return {
            "t": [t for t, _ in rows],
            "ttft_s": [b[1] / b[2] if b[2] else None for _, b in rows],
            "tpot_s": [b[3] / b[4] if b[4] else None for _, b in rows],
            "tokens_per_s": [b[5] for _, b in rows],
            "requests": [int(b[0]) for _, b in rows],
        }

    def _trim(self, now: int) -> None:
        while self._buckets and self._buckets[0][0] <= now - self.window_s:
            self._buckets.popleft()
