"""Results held back until the backend can no longer touch a request's memory.

A failed request's ops may not be cancellable at once (an active NIXL READ): its FAILED
result, whose FailureHook frees the blocks, is published only once every op released.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kv_transfer.api import TransferResult
from kv_transfer.driver import Driver


class Settling:
    """I/O thread only: no locks. `publish` runs exactly once per buried result."""

    def __init__(self, driver: Driver, publish: Callable[[TransferResult], None]) -> None:
        self._driver = driver
        self._publish = publish
        self._waiting: list[tuple[list[Any], TransferResult, Callable[[], None] | None]] = []

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def bury(
        self, ops: list[Any], result: TransferResult, then: Callable[[], None] | None = None
    ) -> None:
        """Publish `result` (then call `then`) once none of `ops` can touch memory any more."""
        still = [op for op in ops if not self._driver.release(op)]
        if still:
            self._waiting.append((still, result, then))
        else:
            self._done(result, then)

    def check(self) -> None:
        """Retry releasing what is still waiting; publish what settled."""
        for entry in list(self._waiting):
            ops, result, then = entry
            ops[:] = [op for op in ops if not self._driver.release(op)]
            if not ops:
                self._waiting.remove(entry)
                self._done(result, then)

    def _done(self, result: TransferResult, then: Callable[[], None] | None) -> None:
        self._publish(result)
        if then is not None:
            then()
