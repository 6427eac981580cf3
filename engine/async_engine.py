"""Drives an `LLMEngine` on its own thread and hands results to asyncio code.

Worker actors receive calls on an event loop while the engine must step without pause, so
the engine gets one thread that owns it; everything else talks to it through:

- `call(fn)`: run `fn(engine)` on the engine thread between two steps (add, abort, reserve,
  admit, ...), awaited as a future: the engine is never touched from two threads.
- `stream(request_id)`: an async iterator of that request's outputs, fed from the engine
  thread with `loop.call_soon_threadsafe`; or, for many requests at once, an
  `OutputChannel` that gets one batch per step (output_channel.py).
- `after_step` hooks: run on the engine thread after every step (a transport's poll).

Plain threads and asyncio only: no Ray, no network.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from core.errors import DeadlineExceededError, WorkerFailedError
from core.request import OutputDelta
from engine.engine import LLMEngine
from engine.output_channel import Item, OutputChannel, is_final

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(eq=False)
class _Stream:
    loop: asyncio.AbstractEventLoop
    deliver: Callable[[list[Item]], None]
    """Runs on `loop` with the request's items of one step (a channel's: several requests')."""
    queue: asyncio.Queue[OutputDelta | BaseException] | None = None
    """Set for a stream of its own (`stream()` reads it); None on a channel."""


class AsyncEngine:
    def __init__(
        self,
        engine: LLMEngine | Callable[[], LLMEngine],
        idle_wait_s: float = 0.02,
        build_timeout_s: float = 900.0,
    ) -> None:
        """`engine`, or a function that builds it: then it is built on the engine thread,
        which makes every later step faster on CPU. Measured (the 125M preset, batch 1,
        2 threads): ~22 ms per decode step built and stepped on one thread, ~27 ms built on
        another thread and stepped here, alternating runs; the OpenMP team and the memory
        the model was loaded with belong to the thread that loaded it. A failed build raises
        here."""
        self.engine: LLMEngine = None  # type: ignore[assignment]  # set before __init__ returns
        self.idle_wait_s = idle_wait_s
        self._commands: queue.SimpleQueue[
            tuple[Callable[[LLMEngine], Any], concurrent.futures.Future]
        ] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self.after_step: list[Callable[[], None]] = []
        self.between_s = 0.0
        """The loop's time between two steps while the engine had work (publishing, hooks,
        commands): core.step_stats `between_s`, which the worker adds to its reports."""
        self.error: Exception | None = None
        """The last step's failure while the engine keeps failing (None once a step works):
        what a health check reports."""
        built = threading.Event()
        failure: list[BaseException] = []

        def build_then_run() -> None:
            try:
                self.engine = engine() if callable(engine) else engine
            except BaseException as e:
                failure.append(e)
                return
            finally:
                built.set()
            self._run()

        self._thread = threading.Thread(target=build_then_run, name="engine-loop", daemon=True)
        self._thread.start()
        if not built.wait(build_timeout_s):
            self._stopped.set()
            raise WorkerFailedError(f"the engine was not built within {build_timeout_s:g} s")
        if failure:
            self._stopped.set()
            raise failure[0]

    # -- calls into the engine thread -------------------------------------------------------
    def submit(self, fn: Callable[[LLMEngine], T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self._stopped.is_set():
            fut.set_exception(WorkerFailedError("the engine is stopped"))
            return fut
        self._commands.put((fn, fut))
        self._wake.set()
        return fut

    def wake(self) -> None:
        """Run the loop's after-step hooks now rather than at the end of its idle wait
        (thread-safe: a transport calls it when a transfer ended)."""
        self._wake.set()

    async def call(self, fn: Callable[[LLMEngine], T], timeout_s: float = 60.0) -> T:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.submit(fn)), timeout_s)
        except TimeoutError as e:
            raise DeadlineExceededError(f"engine call did not finish within {timeout_s} s") from e

    # -- output streams ---------------------------------------------------------------------
    def open_stream(self, request_id: str, channel: OutputChannel | None = None) -> None:
        """Register where `request_id`'s outputs go (before the request can produce output,
        so nothing is lost): a stream of its own on the running loop, read with `stream()`,
        or `channel` (forgotten after the request's last item)."""
        if channel is not None:
            s = _Stream(channel.loop, channel.deliver)
        else:
            q: asyncio.Queue[OutputDelta | BaseException] = asyncio.Queue()
            s = _Stream(asyncio.get_running_loop(), lambda items: _put_all(q, items), q)
        with self._streams_lock:
            self._streams[request_id] = s

    def close_stream(self, request_id: str) -> None:
        with self._streams_lock:
            self._streams.pop(request_id, None)

    async def stream(
        self, request_id: str, timeout_s: float | None = None
    ) -> AsyncIterator[OutputDelta]:
        """Output deltas of `request_id` until one is finished. On timeout or when the consumer
        stops early, the request is aborted (its blocks freed)."""
        with self._streams_lock:
            s = self._streams.get(request_id)
        if s is None or s.queue is None:
            raise KeyError(f"no stream open for {request_id!r}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        finished = False
        try:
            while True:
                remaining = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    # Not asyncio.wait_for: on 3.11 it returns the item when a cancellation
                    # lands as the item arrives, the cancellation lost (a client that hung
                    # up then kept the request generating; cpython gh-86296).
                    async with asyncio.timeout(remaining):
                        item = await s.queue.get()
                except TimeoutError as e:
                    raise DeadlineExceededError(
                        f"request {request_id} passed its deadline of {timeout_s} s"
                    ) from e
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self.close_stream(request_id)
            if not finished:
                self.submit(lambda e: e.abort(request_id))

    def publish(self, items: list[Item]) -> None:
        """Hand items to their streams: one call onto each consumer's loop per stream (per
        channel), in order. Called by the engine thread (a command may call it too)."""
        # Keyed by the delivery function: every request of one channel shares its (bound)
        # `deliver`, so a channel gets one call per step, not one per request.
        batches: dict[Callable[[list[Item]], None], tuple[asyncio.AbstractEventLoop, list[Item]]]
        batches = {}
        with self._streams_lock:
            for request_id, item in items:
                s = self._streams.get(request_id)
                if s is None:
                    continue
                if is_final(item) and s.queue is None:  # `stream()` closes its own
                    del self._streams[request_id]
                batches.setdefault(s.deliver, (s.loop, []))[1].append((request_id, item))
        for deliver, (loop, batch) in batches.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(deliver, batch)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        stepped_at: float | None = None  # the last step's end, while the engine had work
        while not self._stopped.is_set():
            self._run_commands()
            try:
                busy = self.engine.has_unfinished()
                if busy and stepped_at is not None:
                    self.between_s += time.perf_counter() - stepped_at
                outputs = self.engine.step() if busy else []
                stepped_at = time.perf_counter() if busy else None
            except Exception as e:  # a failed step must not hang every client
                stepped_at = None
                if self.error is None:
                    logger.exception("engine step failed; failing the running requests")
                self.error = e
                self._fail_all(e)
                self._wake.wait(self.idle_wait_s)  # a broken engine: don't spin
                continue
            self.error = None
            if busy:
                self.publish([(out.request_id, out) for out in outputs])
            else:
                self._wake.wait(self.idle_wait_s)
                self._wake.clear()
            for hook in list(self.after_step):
                try:
                    hook()
                except Exception:
                    logger.exception("after-step hook failed")

    def _run_commands(self) -> None:
        while True:
            try:
                fn, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(self.engine))
            except BaseException as e:
                fut.set_exception(e)

    def _fail_all(self, error: Exception) -> None:
        """Every open stream gets the error; the engine frees what it still can."""
        with self._streams_lock:
            request_ids = list(self._streams)
        failed = WorkerFailedError(f"engine step failed: {error}")
        self.publish([(request_id, failed) for request_id in request_ids])
        for request_id in request_ids:
            try:
                self.engine.abort(request_id)
            except Exception:
                logger.exception("abort of %s failed on a broken engine", request_id)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout_s)
        while True:
            try:
                _, fut = self._commands.get_nowait()
            except queue.Empty:
                break
            fut.set_exception(WorkerFailedError("the engine stopped"))


def _put_all(q: asyncio.Queue[OutputDelta | BaseException], items: list[Item]) -> None:
    for _, item in items:
        q.put_nowait(item)
