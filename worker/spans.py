"""A worker's side of a request's trace: spans whose parent is the router's call, carried in
the request (`EngineRequest.trace`, core/tracing.py), exported by this worker's own
TracerProvider. A request that comes untraced gets none (the no-op span), whatever this
worker's setting.

    served(tracing, carried, name)      a server span for one actor call
    prefill_spans(...)                  a prompt's queue and compute time in the engine
    kv_transfer_span(...)               a prompt's KV leaving: per layer group, queued vs moving
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace

from core.request import RequestTimings
from core.tracing import MAX_LAYER_GROUPS, Carried, SpanName, Tracing, epoch_ns, parent_of_carried


def served(tracing: Tracing, carried: Carried | None, name: str, **attributes: Any) -> trace.Span:
    """A server span under the router's call `carried` names; the no-op span when the
    request is untraced (then nothing is recorded here either)."""
    parent = parent_of_carried(carried) if carried is not None and carried.traceparent else None
    if parent is None:
        return trace.INVALID_SPAN
    return tracing.tracer.start_span(
        name, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes
    )


def prefill_spans(
    tracing: Tracing, parent: trace.Span, timings: RequestTimings, num_chunks: int
) -> None:
    """The prompt's wait in the engine's queue and its compute (its `num_chunks` steps), from
    the engine's own stamps."""
    if not parent.is_recording() or timings.first_scheduled is None:
        return
    context = trace.set_span_in_context(parent)
    queued = tracing.tracer.start_span(
        SpanName.PREFILL_QUEUED, context=context, start_time=epoch_ns(timings.arrival)
    )
    queued.end(end_time=epoch_ns(timings.first_scheduled))
    compute = tracing.tracer.start_span(
        SpanName.PREFILL_COMPUTE,
        context=context,
        start_time=epoch_ns(timings.first_scheduled),
        attributes={"baton.prefill.chunks": num_chunks},
    )
    compute.end(end_time=epoch_ns(timings.first_token or time.monotonic()))


def kv_transfer_span(
    tracing: Tracing,
    parent: trace.Span,
    post_times_ns: list[int],
    bytes_per_layer: int,
    transport: str,
    error: str | None,
) -> None:
    """The prompt's KV transfer, ended now (every rank's transfer reported). Each layer is
    queued at the transport when the model wrote it (`post_times_ns`); the transfer moves
    layers as they come. A `kv_transfer.layers` child per group of layers (at most
    MAX_LAYER_GROUPS) runs from its first layer's post to the next group's first post (the
    last: to the end). `baton.kv.queued_s` is the time from the first layer's post to the
    last's (the layers waiting on the model), `baton.kv.moving_s` from the last post to the
    end (what the transfer added after the model was done)."""
    if not post_times_ns:  # (`parent` may have ended: the transfer outlasts the prefill call)
        return
    end = time.time_ns()
    num_layers = len(post_times_ns)
    span = tracing.tracer.start_span(
        SpanName.KV_TRANSFER,
        context=trace.set_span_in_context(parent),
        start_time=post_times_ns[0],
        attributes={
            "baton.kv.transport": transport,
            "baton.kv.bytes": bytes_per_layer * num_layers,
            "baton.kv.layers": num_layers,
            "baton.kv.queued_s": (post_times_ns[-1] - post_times_ns[0]) / 1e9,
            "baton.kv.moving_s": (end - post_times_ns[-1]) / 1e9,
        },
    )
    if error is not None:
        span.set_status(trace.StatusCode.ERROR, error[:200])
    context = trace.set_span_in_context(span)
    per_group = -(-num_layers // MAX_LAYER_GROUPS)
    for first in range(0, num_layers, per_group):
        last = min(first + per_group, num_layers) - 1
        group_end = post_times_ns[last + 1] if last + 1 < num_layers else end
        group = tracing.tracer.start_span(
            SpanName.KV_LAYERS,
            context=context,
            start_time=post_times_ns[first],
            attributes={
                "baton.kv.first_layer": first,
                "baton.kv.last_layer": last,
                "baton.kv.bytes": bytes_per_layer * (last - first + 1),
            },
        )
        group.end(end_time=max(group_end, post_times_ns[first]))
    span.end(end_time=end)
