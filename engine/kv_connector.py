"""The seam between the engine and whatever ships KV off the worker (the prefill worker's
transport). The engine calls it around each step; it never imports a network library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from core.device_event import DeviceEvent
from engine.request import Request

LayerHook = Callable[[int, DeviceEvent | None], None]
"""Called with a layer index and the event after which that layer's K/V is in the cache
(None: it is already, as on the CPU). Posting a transfer before the event completed would
ship KV the GPU has not written yet (core/device_event.py)."""


def layer_written(device: torch.device) -> DeviceEvent | None:
    """An event on the device's current stream, after every kernel launched so far."""
    if device.type != "cuda":
        return None  # CPU kernels run synchronously: the layer is written when this is called
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class KVConnector(Protocol):
    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        """Called before a step's forward pass with the requests whose prompt KV will be
        complete after it, and their block ids. Returns a hook called with each layer
        index as soon as that layer's kernels are launched, with the event that marks
        them written (so a layer can be sent while the next one computes), or None."""

    def end_step(self) -> None:
        """Called after the step's outputs were processed."""
