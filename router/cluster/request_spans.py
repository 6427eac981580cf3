"""The attributes and the marker spans the request path records (core/tracing.py names the
spans; docs/observability.md shows the tree): what routing decided and from what, which try
an attempt is and why it was retried, and how the request finished."""

from __future__ import annotations

from opentelemetry.context import Context

from core.request import EngineRequest, OutputDelta
from core.tracing import SpanName, Tracing
from router.routing.decision import RoutingDecision

Attributes = dict[str, str | int | float | bool | list[str]]


def route_attributes(decision: RoutingDecision) -> Attributes:
    """The decision and its inputs: the candidates, each worker's cached prompt blocks (the
    index's view), the chosen prefill and decode worker, and why."""
    cached = sorted(decision.cached_by_worker.items())
    return {
        "baton.route.candidates": list(decision.candidates),
        "baton.route.cached_blocks": [f"{worker}={n}" for worker, n in cached],
        "baton.route.prompt_blocks": decision.num_prompt_blocks,
        "baton.route.prefill_worker": decision.prefill_worker_id or "",
        "baton.route.decode_worker": decision.decode_worker_id,
        "baton.route.prefill_cached_blocks": decision.prefill_cached_blocks,
        "baton.route.decode_cached_blocks": decision.decode_cached_blocks,
        "baton.route.reason": decision.reason,
        "baton.route.index_degraded": decision.index_degraded,
    }


def attempt_attributes(request: EngineRequest, attempt: int, retry_reason: str) -> Attributes:
    attributes: Attributes = {
        "baton.request_id": request.request_id,
        "baton.attempt": attempt,
        "baton.prompt_tokens": len(request.prompt_token_ids),
        "baton.resumed_tokens": request.resume.num_output_tokens,
    }
    if retry_reason:  # the try before this one lost its worker
        attributes["baton.retry.reason"] = retry_reason
    return attributes


def finish_span(
    tracing: Tracing, parent: Context, delta: OutputDelta, num_tokens: int, attempts: int
) -> None:
    """A marker span at the request's end: how it finished, after how many tries."""
    span = tracing.tracer.start_span(SpanName.FINISH, context=parent)
    span.set_attributes({
        "baton.finish_reason": str(delta.finish_reason or ""),
        "baton.output_tokens": num_tokens,
        "baton.attempts": attempts,
    })  # fmt: skip
    span.end()
