"""The seam between the engine and whatever moves KV off the worker: a connector with a
scheduler side and a layer side (vLLM v1's split). The engine calls it at fixed points of its
step and knows nothing of roles, transports or networks.

    scheduler side   request_prefilled(req, first_token, logprob, delta) -> bool
                         after the first token a request samples here: True parks it (out
                         of the batch, its blocks held until `LLMEngine.release`) so its KV
                         can be handed over; False lets it decode on here
                     forget(request_id)
                         the request left the engine (aborted): drop what is kept for it
    layer side       begin_step(completing) -> LayerHook | None
                         before a step's forward, with the requests whose prompt KV the step
                         completes: the hook fires as each layer is written
                     end_step()
                         after the step's outputs were processed

Receiving needs no hook inside the step: the transport writes a reservation's blocks
(engine/held.py) while it waits outside the schedule, and the worker admits it once every
layer landed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from core.device_event import DeviceEvent
from core.request import OutputDelta, TokenLogprob
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


def prompts_completing(
    items: list[tuple[Request, int]], block_ids: Callable[[str], list[int]]
) -> list[tuple[Request, list[int]]]:
    """The requests of a step's `items` (request, tokens) whose prompt KV the step completes,
    with their blocks: what `begin_step` is given."""
    return [
        (req, block_ids(req.request_id))
        for req, n in items
        if req.num_computed_tokens + n == req.num_tokens and req.num_sampled_here == 0
    ]


class KVConnector(Protocol):
    # -- scheduler side ------------------------------------------------------------------
    def request_prefilled(
        self, req: Request, first_token: int, logprob: TokenLogprob | None, delta: OutputDelta
    ) -> bool:
        """`req` sampled its first token here (reported in `delta`): True parks it."""

    def forget(self, request_id: str) -> None:
        """`request_id` was aborted: nothing more happens to it here."""

    # -- layer side ----------------------------------------------------------------------
    def begin_step(self, completing: list[tuple[Request, list[int]]]) -> LayerHook | None:
        """Called before a step's forward pass with the requests whose prompt KV will be
        complete after it, and their block ids. Returns a hook called with each layer
        index as soon as that layer's kernels are launched, with the event that marks
        them written (so a layer can be sent while the next one computes), or None."""

    def end_step(self) -> None:
        """Called after the step's outputs were processed."""
