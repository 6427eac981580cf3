"""Running the gRPC server on a background thread with its own event loop (CLI, tests)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from router.frontdoor.grpc.server import GRPCServer


class GRPCServerThread:
    """`GRPCServer.start(*args, **kwargs)` on a new thread; `.port` once `start` returns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="grpc")
        self.server: GRPCServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None, "start() first"
        return self.server.port

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> GRPCServerThread:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            GRPCServer.start(*self._args, **self._kwargs), self._loop
        )
        self.server = future.result(timeout_s)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()
