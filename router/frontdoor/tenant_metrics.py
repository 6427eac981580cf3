"""Per-tenant series of the front doors (the tenant as router/frontdoor/tenants.py names
it): requests waiting at this door's prefill gates, the tokens served (prompt and output),
and TTFT. Tenants are labels, so their number is bounded: past MAX_TENANTS distinct names
the rest report together as `other` (a header a client sets could otherwise grow the
series without end)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MAX_TENANTS = 256
OTHER = "other"
ANONYMOUS = "anonymous"
"""The label of requests with neither a tenant header nor an API key."""


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry, buckets: tuple[float, ...]) -> None:
        self.queued = Gauge(
            "baton:tenant_queued_requests",
            "Requests waiting at this door's prefill gates, per tenant.",
            ["tenant"],
            registry=registry,
        )
        self.tokens = Counter(
            "baton:tenant_tokens",
            "Tokens served per tenant: prompt tokens of finished requests, output tokens.",
            ["tenant", "kind"],
            registry=registry,
        )
        self.ttft = Histogram(
            "baton:tenant_time_to_first_token_seconds",
            "Time to first token, per tenant.",
            ["tenant"],
            buckets=buckets,
            registry=registry,
        )
        self.queued_source: Callable[[], dict[str, int]] | None = None
        """The gates' waiters per tenant (the cluster's request path sets it)."""
        self._known: set[str] = set()

    def label(self, tenant: str) -> str:
        name = tenant or ANONYMOUS
        if name in self._known:
            return name
        if len(self._known) >= MAX_TENANTS:
            return OTHER
        self._known.add(name)
        return name

    def observe(
        self, tenant: str, ttft_s: float | None, prompt_tokens: int, output_tokens: int
    ) -> None:
        label = self.label(tenant)
        self.tokens.labels(tenant=label, kind="prompt").inc(prompt_tokens)
        self.tokens.labels(tenant=label, kind="output").inc(output_tokens)
        if ttft_s is not None:
            self.ttft.labels(tenant=label).observe(ttft_s)

    def refresh(self) -> None:
        """The queued gauge from the gates now; a tenant no longer waiting reads 0."""
        if self.queued_source is None:
            return
        counts: dict[str, int] = {}
        for tenant, n in self.queued_source().items():
            label = self.label(tenant)
            counts[label] = counts.get(label, 0) + n
        for label in self._known:
            self.queued.labels(tenant=label).set(counts.get(label, 0))
