"""The front door's end of a decode worker's output channel (worker/outlets.py).

One per (front door, decode worker): a task reads the worker's `outputs` stream — one list of
(request id, delta or error) per engine step — and hands each item to its request's queue,
and the worker's report that rides it to the front door's membership.
If the stream breaks (the worker died), every request waiting on it gets the error, which the
request path treats like a stream of its own breaking: suspect the worker, retry elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from typing import Any, Protocol

import ray

from core.errors import WorkerFailedError
from core.request import OutputDelta
from worker.records import WorkerReport

logger = logging.getLogger(__name__)

Queue = asyncio.Queue[OutputDelta | BaseException]


class Reports(Protocol):
    """Where a worker's reports that ride its stream go (the front door's Membership)."""

    poll_interval_s: float

    def cursor(self, worker_id: str) -> int: ...

    def take_report(self, worker_id: str, report: WorkerReport) -> None: ...


class WorkerChannel:
    def __init__(self, worker_id: str, handle: Any, reports: Reports | None = None) -> None:
        """With `reports`, the worker's reports ride the stream every `poll_interval_s` while
        it steps, their KV events from after the last batch `reports` applied."""
        self.worker_id = worker_id
        self.channel_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._queues: dict[str, Queue] = {}
        self._reports = reports
        self.error: BaseException | None = None
        """Why the stream ended; a broken channel is replaced by a new one."""
        every, after = None, -1
        if reports is not None:
            every, after = reports.poll_interval_s, reports.cursor(worker_id)
        stream = handle.outputs.options(num_returns="streaming").remote(
            self.channel_id, every, after
        )
        self._task = asyncio.get_running_loop().create_task(self._read(stream))

    def open(self, request_id: str) -> Queue:
        """The queue `request_id`'s items will land in; open it before the call that starts
        the request, so nothing is lost."""
        q: Queue = asyncio.Queue()
        if self.error is not None:
            q.put_nowait(self.error)
        self._queues[request_id] = q
        return q

    def close(self, request_id: str) -> None:
        self._queues.pop(request_id, None)

    def stop(self) -> None:
        """The worker left: end the stream (the worker aborts what is still open on it)."""
        self._task.cancel()

    async def _read(self, stream: Any) -> None:
        try:
            async for ref in stream:
                for request_id, item in await ref:
                    if not request_id:  # the worker's report (no request has an empty id)
                        if self._reports is not None:
                            self._reports.take_report(self.worker_id, item)
                        continue
                    q = self._queues.get(request_id)
                    if q is not None:
                        q.put_nowait(item)
            error: BaseException = WorkerFailedError(f"{self.worker_id} ended its output stream")
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                ray.cancel(stream)
            error = WorkerFailedError(f"{self.worker_id} left the cluster")
        except Exception as e:  # the actor died or became unreachable: Ray's error says which
            logger.info("output channel of %s broke: %s", self.worker_id, type(e).__name__)
            error = e
        self.error = error
        for q in self._queues.values():
            q.put_nowait(error)
