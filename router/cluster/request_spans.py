"""The attributes and the marker spans the request path records (core/tracing.py names the
spans; docs/observability.md shows the tree): what routing decided and from what, which try
an attempt is and why it was retried, what a prefill moved, an attempt's stream in spans,
and how the request finished."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context

from core.request import EngineRequest, OutputDelta
from core.tracing import DECODE_SPAN_TOKENS, MAX_DECODE_SPANS, SpanName, Tracing, epoch_ns
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


def prefill_attributes(span: trace.Span, reply: Any, reservation: Any, prefill: Any) -> None:
    """What a disaggregated prefill step moved: the blocks sent past D's cached ones."""
    if span.is_recording():
        num_sent = max(0, reply.num_blocks - reservation.skip_blocks)
        span.set_attributes({
            "baton.cached_tokens": reply.num_cached_tokens,
            "baton.blocks_sent": num_sent,
            "baton.kv.bytes": num_sent * prefill.info.kv_bytes_per_block,
        })  # fmt: skip


class DecodeSpans:
    """The stream's spans: `first_token` until the first delta, then a `decode` span per
    DECODE_SPAN_TOKENS tokens; the last of MAX_DECODE_SPANS takes every token after it."""

    def __init__(self, attempt: Any, since: float) -> None:
        self.tracer, self.context = attempt.tracer, trace.set_span_in_context(attempt.span)
        self.worker = {"baton.worker": attempt.decode.worker_id}
        self.span = self.tracer.start_span(
            SpanName.FIRST_TOKEN,
            context=self.context,
            start_time=epoch_ns(since),
            attributes=self.worker,
        )
        self.first, self.num_tokens, self.num_spans, self.from_token = True, 0, 0, 0

    def add(self, num_new: int) -> None:
        self.num_tokens += num_new
        full = self.num_tokens - self.from_token >= DECODE_SPAN_TOKENS
        if self.first or (full and self.num_spans < MAX_DECODE_SPANS):
            self.end()
            self.first = False
            self.num_spans += 1
            self.span = self.tracer.start_span(
                SpanName.DECODE, context=self.context, attributes=self.worker
            )
            self.from_token = self.num_tokens

    def end(self) -> None:
        if self.span.is_recording():
            if not self.first:
                self.span.set_attribute("baton.tokens.from", self.from_token)
                self.span.set_attribute("baton.tokens.to", self.num_tokens)
            self.span.end()
