"""What every HTTP handler needs: the backend, the metrics, the request deadline policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.frontdoor.adapters import AdapterRegistry
from router.frontdoor.backend import Backend
from router.frontdoor.metrics import Metrics
from router.frontdoor.tools.parsers import HermesParser, ToolCallParser


@dataclass(frozen=True)
class ServerContext:
    backend: Backend
    metrics: Metrics
    request_timeout_s: float = 300.0
    """Default deadline; a request's own `timeout` may only shorten it."""
    tool_parser: ToolCallParser = field(default_factory=HermesParser)
    """Reads tool calls from replies to tool_choice "auto" (`--tool-call-parser`)."""
    reasoning_parser: str | None = None
    """Splits `<think>` text into reasoning_content (`--reasoning-parser`); None: off."""
    adapters: AdapterRegistry = field(default_factory=lambda: AdapterRegistry(""))
    """The LoRA adapters `model` may name besides the base model."""

    def timeout_s(self, requested: float | None) -> float:
        if requested is None:
            return self.request_timeout_s
        return min(requested, self.request_timeout_s)
