"""Running one API request as several backend requests (`n` choices, batched prompts) and
merging their delta streams.

Each choice is its own `GenerateRequest` (`<id>-<index>`); the merged stream yields
`(index, output)` as any of them produces. The first error cancels the rest; closing the
merged stream early cancels all of them (their blocks are freed by the backend).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace

from core.lora import LoRARef
from core.request import OutputDelta
from core.sampling import SamplingParams
from router.frontdoor.backend import Backend, GenerateRequest
from router.frontdoor.metrics import Metrics
from router.frontdoor.tracking import run_tracked

_DONE = object()


@dataclass(frozen=True)
class Choice:
    index: int
    prompt_token_ids: list[int]
    params: SamplingParams


def seeded(params: SamplingParams, n: int) -> list[SamplingParams]:
    """`n` copies of params; with a seed, choice i uses seed + i so the choices differ
    but the whole response stays reproducible."""
    if params.seed is None:
        return [params] * n
    return [replace(params, seed=params.seed + i) for i in range(n)]


async def generate_choices(
    backend: Backend,
    request_id: str,
    choices: list[Choice],
    metrics: Metrics,
    timeout_s: float,
    priority: int = 0,
    tenant: str = "",
    lora: LoRARef | None = None,
) -> AsyncGenerator[tuple[int, OutputDelta]]:
    def request(c: Choice) -> GenerateRequest:
        rid = request_id if len(choices) == 1 else f"{request_id}-{c.index}"
        return GenerateRequest(rid, c.prompt_token_ids, c.params, timeout_s, priority, tenant, lora)

    if len(choices) == 1:  # the common case: no tasks, no queue
        c = choices[0]
        stream = run_tracked(backend, request(c), metrics)
        try:
            async for out in stream:
                yield c.index, out
        finally:
            await stream.aclose()
        return

    queue: asyncio.Queue[tuple[int, OutputDelta] | BaseException | object] = asyncio.Queue()

    async def pump(c: Choice) -> None:
        try:
            async for out in run_tracked(backend, request(c), metrics):
                queue.put_nowait((c.index, out))
            queue.put_nowait(_DONE)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            queue.put_nowait(e)

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item  # type: ignore[misc]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Prefetched:
    """A merged stream whose first item was already awaited: errors raised before any
    output (bad prompt, overloaded) surface while an HTTP status can still be sent."""

    def __init__(self, stream: AsyncGenerator[tuple[int, OutputDelta]]) -> None:
        self._stream = stream
        self._first: tuple[int, OutputDelta] | None = None

    async def start(self) -> Prefetched:
        try:
            self._first = await anext(self._stream)
        except StopAsyncIteration:
            self._first = None
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aiter__(self) -> AsyncIterator[tuple[int, OutputDelta]]:
        if self._first is None:
            return
        yield self._first
        async for item in self._stream:
            yield item

    async def aclose(self) -> None:
        await self._stream.aclose()
