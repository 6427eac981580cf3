"""Running requests to the end on an engine that steps in this thread (the offline API, the
tensor-parallel driver's convenience), accumulating each request's deltas into its whole
output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from core.request import OutputDelta, RequestOutput


class Steppable(Protocol):
    def has_unfinished(self) -> bool: ...
    def step(self) -> list[OutputDelta]: ...


def run_to_completion(
    engine: Steppable, prompts: Mapping[str, list[int]]
) -> dict[str, RequestOutput]:
    """Step `engine` until nothing is unfinished, accumulating every request's deltas;
    `prompts` (request id -> prompt token ids) names the prompts of those it knows."""
    outputs = {rid: RequestOutput(rid, list(prompt)) for rid, prompt in prompts.items()}
    while engine.has_unfinished():
        for delta in engine.step():
            out = outputs.get(delta.request_id)
            if out is None:
                out = outputs[delta.request_id] = RequestOutput(delta.request_id, [])
            out.add(delta)
    return outputs
