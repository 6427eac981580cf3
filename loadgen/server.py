"""`baton serve` as a subprocess the benchmark owns: free ports, wait for /health, and stop
it by PID however the run ends.

The server is started in a new session, so it leads its own process group: Ray's GCS,
raylet and worker processes it spawns join that group. Stopping sends SIGTERM to the server
(it shuts its cluster down cleanly), and only if that times out SIGKILLs the group it leads,
which holds nothing but processes this benchmark started. The server is `python -m
router.cli serve`: the benchmark reaches it only through its process and its HTTP port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PORT_TAKEN = "address already in use"
"""What the server logs when its HTTP or gRPC port is taken (uvicorn, grpc)."""


class PortTaken(RuntimeError):
    pass


class ServerProcess:
    """A `baton serve` subprocess on free 127.0.0.1 ports; a context manager."""

    def __init__(
        self, serve_args: list[str], log_path: Path, start_timeout_s: float = 240.0
    ) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        self.serve_args = serve_args
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "router.cli", "serve", *self.serve_args,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--grpc-port", str(self.grpc_port)]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self, tries: int = 3) -> ServerProcess:
        """Start it and wait for /health; a port taken between `free_port` and the server's
        bind (Ray's own processes take ports as they start) is retried on fresh ports."""
        for attempt in range(tries):
            try:
                return self._start()
            except PortTaken:
                if attempt == tries - 1:
                    raise
                self.port, self.grpc_port = free_port(), free_port()
        raise AssertionError("unreachable")

    def _start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it until stop()
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**self.environment(), "PYTHONUNBUFFERED": "1"},
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        log.close()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {self.proc.returncode} before it was healthy; "
                    f"see {self.log_path}:\n{_tail(self.log_path)}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if _PORT_TAKEN in _tail(self.log_path, 200):
                raise PortTaken(f"a port of {self.url} was taken before the server bound it")
            time.sleep(0.5)
        raise TimeoutError(f"server not healthy after {self.start_timeout_s:.0f} s; "
                           f"see {self.log_path}")  # fmt: skip

    def stop(self, timeout_s: float = 60.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout_s)
        # The group this server leads (its Ray processes), if anything of it is left.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.stop()


def _tail(path: Path, num_lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return ""
