"""What every HTTP handler needs: the backend, the metrics, the request deadline policy."""

from __future__ import annotations

from dataclasses import dataclass

from router.frontdoor.backend import Backend
from router.frontdoor.metrics import Metrics


@dataclass(frozen=True)
class ServerContext:
    backend: Backend
    metrics: Metrics
    request_timeout_s: float = 300.0
    """Default deadline; a request's own `timeout` may only shorten it."""

    def timeout_s(self, requested: float | None) -> float:
        if requested is None:
            return self.request_timeout_s
        return min(requested, self.request_timeout_s)
