"""The front door's slowest recent requests, each with its timeline: where a slow request's
time went, on the admin dashboard, with no tracing backend.

It is an OpenTelemetry span processor on the door's own tracer provider
(core/tracing.py, `Tracing(..., keep=SlowRequests(n))`): the door's spans (the request
root, parse, template, tokenize, each attempt's route, gate wait, reserve / prefill /
admit calls, first token, decode runs, finish) are the request path's one record of where
its time goes, so the timeline is built from them rather than from a second set of stamps.
The cost is the SDK recording those spans (about 30 for a 256-token request) and this
processor sorting them: bench/observability/slow_requests_overhead.py measures it against
requests served by a real engine (docs/observability.md has the figures). `--slow-requests
0` turns it off; with export off too, the door runs the API's no-op tracer again. A
worker's own spans are in the worker's process, not here: the door's client span of each
call (reserve, prefill, admit) stands for it.

Which requests: two rankings of the requests that finished at this door in the last
`window_s` seconds, the `capacity` slowest by TTFT (arrival at the door to the first token
the door streamed: `baton.ttft_s`; requests that sent none are left out) and the
`capacity` slowest by end to end (arrival to the reply's last byte: `baton.e2e_s`).

    window_s = num_slices slices of slice_s                       now
    |  slice  |  slice  |  slice  |  ...  |  slice  |  slice (current)  |
      each keeps its own top `capacity` per ranking (a min-heap)

The window's top N is among the union of its slices' top N, so the answer is exact at the
granularity of a slice, and memory is bounded: num_slices x 2 x capacity requests of at
most ~50 spans each. The door's spans end before their root (the reply's last byte), so
they wait by trace id until it ends; at most `MAX_PENDING_SPANS` wait, the oldest trace's
dropped first (a span that ends after its root, or one whose root never comes).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import StatusCode

from core.tracing import SpanName

MAX_PENDING_SPANS = 20_000
"""Spans waiting for their request's root: about 500 requests in flight at once."""
MAX_ATTRIBUTE_CHARS = 200
Value = str | int | float | bool


class Ranking(Enum):
    TTFT = "ttft"
    E2E = "e2e"


@dataclass(frozen=True)
class SpanRecord:
    """One door-side span of a request, as the timeline draws it."""

    name: str
    start_s: float
    """From the request's arrival at the door."""
    duration_s: float
    depth: int
    """0: the request; 1: the door's stages, each attempt, finish; 2: an attempt's steps."""
    worker: str
    """The worker the step waited on (empty for the door's own stages)."""
    attributes: dict[str, Value]
    """Its `baton.*` attributes (cached blocks, bytes moved, the retry's reason, ...)."""
    error: bool = False


@dataclass(frozen=True)
class SlowRequest:
    request_id: str
    trace_id: str
    """Empty unless the trace was exported (sampled): only then does a collector hold it."""
    finished_at: float
    """Epoch seconds."""
    ttft_s: float | None
    e2e_s: float
    status: str
    route: str
    prompt_tokens: int
    output_tokens: int
    retries: int
    prefill_worker: str
    decode_worker: str
    spans: tuple[SpanRecord, ...]


@dataclass
class _Slice:
    index: int
    heaps: dict[Ranking, list[tuple[float, int, SlowRequest]]]


class SlowRequests(SpanProcessor):
    """The `capacity` slowest requests of the last `window_s`, by TTFT and by end to end.
    Thread-safe: spans end on whichever thread ends them."""

    def __init__(self, capacity: int = 20, window_s: float = 600.0, num_slices: int = 10) -> None:
        if capacity < 1 or window_s <= 0 or num_slices < 1:
            raise ValueError("capacity and num_slices must be >= 1, window_s > 0")
        self.capacity, self.window_s, self.num_slices = capacity, window_s, num_slices
        self.slice_s = window_s / num_slices
        self._slices: list[_Slice] = []
        self._pending: OrderedDict[int, list[ReadableSpan]] = OrderedDict()
        self._num_pending = 0
        self._seq = itertools.count()
        self._lock = threading.Lock()

    # -- SpanProcessor -------------------------------------------------------------------
    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None:
            return
        with self._lock:
            if span.name != SpanName.REQUEST:
                self._pending.setdefault(context.trace_id, []).append(span)
                self._num_pending += 1
                while self._num_pending > MAX_PENDING_SPANS:
                    _, dropped = self._pending.popitem(last=False)
                    self._num_pending -= len(dropped)
                return
            self._finished(span, self._take(context.trace_id, context.span_id))

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    # -- the rankings --------------------------------------------------------------------
    def slowest(self, ranking: Ranking, now: float | None = None) -> list[SlowRequest]:
        """The `capacity` slowest requests that finished within `window_s` of `now`,
        slowest first."""
        oldest = self._slice_index(time.time() if now is None else now) - self.num_slices + 1
        with self._lock:
            held = [e for s in self._slices if s.index >= oldest for e in s.heaps[ranking]]
        return [e[2] for e in heapq.nlargest(self.capacity, held)]

    def report(self, now: float | None = None) -> dict[str, Any]:
        """Both rankings as the admin API sends them (GET /admin/api/slow-requests)."""
        now = time.time() if now is None else now
        return {
            "capacity": self.capacity,
            "window_s": self.window_s,
            **{r.value: [asdict(q) for q in self.slowest(r, now)] for r in Ranking},
        }

    def num_held(self) -> int:
        """Requests held in every slice (each counted once per ranking it is in)."""
        with self._lock:
            return sum(len(h) for s in self._slices for h in s.heaps.values())

    def _slice_index(self, at: float) -> int:
        return int(at // self.slice_s)

    def _take(self, trace_id: int, root_id: int) -> list[ReadableSpan]:
        """The pending spans under root `root_id` (a caller may reuse one trace id for
        several requests: only this root's descendants are its own)."""
        spans = self._pending.get(trace_id)
        if not spans:
            return []
        mine: set[int] = {root_id}
        taken: list[ReadableSpan] = []
        rest = spans
        while True:  # children before grandchildren: a few passes over a few dozen spans
            parents = set(mine)
            found = [s for s in rest if s.parent is not None and s.parent.span_id in parents]
            if not found:
                break
            taken += found
            mine.update(s.context.span_id for s in found if s.context is not None)
            rest = [s for s in rest if s.parent is None or s.parent.span_id not in parents]
        self._num_pending -= len(spans) - len(rest)
        if rest:
            self._pending[trace_id] = rest
        else:
            del self._pending[trace_id]
        return taken

    def _finished(self, root: ReadableSpan, spans: list[ReadableSpan]) -> None:
        attributes = root.attributes or {}
        e2e = float(attributes.get("baton.e2e_s", _seconds(root.start_time, root.end_time)))
        ttft = attributes.get("baton.ttft_s")
        values = {Ranking.E2E: e2e, Ranking.TTFT: None if ttft is None else float(ttft)}
        finished_at = (root.end_time or time.time_ns()) / 1e9
        current = self._slice_of(self._slice_index(finished_at))
        if current is None:  # finished before the window (a clock step back): not kept
            return
        wanted = [r for r, v in values.items() if v is not None and self._enters(current, r, v)]
        if not wanted:  # the common case once the slice is full: no record is built
            return
        request = _request(root, spans, values[Ranking.TTFT], e2e, finished_at)
        seq = next(self._seq)
        for ranking in wanted:
            heap, entry = current.heaps[ranking], (values[ranking] or 0.0, seq, request)
            if len(heap) < self.capacity:
                heapq.heappush(heap, entry)
            else:
                heapq.heapreplace(heap, entry)

    def _enters(self, current: _Slice, ranking: Ranking, value: float) -> bool:
        heap = current.heaps[ranking]
        return len(heap) < self.capacity or value > heap[0][0]

    def _slice_of(self, index: int) -> _Slice | None:
        """The slice a request finishing in slice `index` joins (a new one past the last;
        the slices that fall out of the window go)."""
        if not self._slices or self._slices[-1].index < index:
            self._slices.append(_Slice(index, {r: [] for r in Ranking}))
            oldest = index - self.num_slices + 1
            self._slices = [s for s in self._slices if s.index >= oldest]
        return next((s for s in reversed(self._slices) if s.index <= index), None)


def _seconds(start_ns: int | None, end_ns: int | None) -> float:
    return max(0.0, ((end_ns or 0) - (start_ns or 0)) / 1e9)


def _request(
    root: ReadableSpan, spans: list[ReadableSpan], ttft: float | None, e2e: float, at: float
) -> SlowRequest:
    a = root.attributes or {}
    start = root.start_time or 0
    depth = {root.context.span_id: 0} if root.context is not None else {}
    records = [SpanRecord(root.name, 0.0, e2e, 0, "", {})]
    # By start, the longer first at a tie: a parent comes before its children (their depth).
    for span in sorted(spans, key=lambda s: (s.start_time or 0, -(s.end_time or 0))):
        parent = span.parent.span_id if span.parent is not None else 0
        level = depth.get(parent, 0) + 1
        if span.context is not None:
            depth[span.context.span_id] = level
        attributes = {k: _value(v) for k, v in (span.attributes or {}).items()}
        records.append(
            SpanRecord(
                span.name,
                _seconds(start, span.start_time),
                _seconds(span.start_time, span.end_time),
                level,
                str(attributes.pop("baton.worker", "")),
                attributes,
                span.status.status_code is StatusCode.ERROR,
            )
        )
    context = root.context
    exported = context is not None and context.trace_flags.sampled  # a collector has it
    return SlowRequest(
        request_id=str(a.get("baton.request_id", "")),
        trace_id=format(context.trace_id, "032x") if exported else "",
        finished_at=at,
        ttft_s=ttft,
        e2e_s=e2e,
        status=str(a.get("baton.status", "ok")),
        route=str(a.get("baton.door.route", "")),
        prompt_tokens=int(a.get("baton.prompt_tokens", 0)),
        output_tokens=int(a.get("baton.output_tokens", 0)),
        retries=int(a.get("baton.retries", 0)),
        prefill_worker=str(a.get("baton.prefill_worker", "")),
        decode_worker=str(a.get("baton.decode_worker", "")),
        spans=tuple(records),
    )


def _value(v: Any) -> Value:
    """An attribute as JSON carries it: a list (the route's candidates and cached blocks)
    as one string, cut at MAX_ATTRIBUTE_CHARS."""
    if isinstance(v, (bool, int, float)):
        return v
    text = ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    return text[:MAX_ATTRIBUTE_CHARS]
