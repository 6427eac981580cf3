"""The seam between the engine and whatever ships KV off the worker (the prefill worker's
transport). The engine calls it around each step; it never imports a network library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from engine.request import Request

LayerHook = Callable[[int], None]


class KVConnector(Protocol):
    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        """Called before a step's forward pass with the requests whose prompt KV will be
        complete after it, and their block ids. Returns a hook the model calls with each
        layer index as soon as that layer's K/V is in the cache (so a layer can be sent
        while the next one computes), or None."""

    def end_step(self) -> None:
        """Called after the step's outputs were processed."""
