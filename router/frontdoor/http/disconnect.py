"""A completion whose client hung up stops: its backend requests are aborted and their KV
freed on every worker, instead of generating a reply nobody will read.

A streamed reply already stops that way (the response's send fails and the stream is closed).
A non-streaming one sends nothing until it is done, so nothing would notice the client
leave: its handler runs beside a watcher of the connection, and the first to finish
cancels the other. Cancelling the handler closes the merged delta stream, which aborts the
requests (`fanout.generate_choices`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import Response

CLIENT_CLOSED = 499
"""nginx's status for a request whose client closed the connection; never seen by it."""


async def until_disconnect(request: Request, handler: Coroutine[Any, Any, object]) -> object:
    work = asyncio.ensure_future(handler)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    if work.done() or watcher.cancelled() or watcher.exception() is not None:
        return await work  # done, or a watcher that could not tell: the reply goes on
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await work  # the requests are aborted by the time this returns
    return Response(status_code=CLIENT_CLOSED)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone; the body was read before the handler ran, so the
    next message on the connection can only be its end."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
