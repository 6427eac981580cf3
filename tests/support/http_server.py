"""Running the HTTP app under uvicorn on a background thread (the CLI and the tests)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI


class HTTPServerThread:
    """uvicorn on its own thread and event loop, bound before `start` returns.

    `port=0` picks a free port; read it from `.port`. `stop` asks uvicorn to finish the
    open requests and joins the thread.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True,
            name=f"http-{self.port}",
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> HTTPServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.server.force_exit = True
            self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> HTTPServerThread:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
