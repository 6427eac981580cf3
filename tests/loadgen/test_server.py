"""The benchmark's server process (loadgen/server.py): a port taken before the server
binds it is retried on fresh ports, not waited on until the start-up timeout."""

from __future__ import annotations

import sys

import pytest

from loadgen.server import PortTaken, ServerProcess


class _Taken(ServerProcess):
    """A 'server' that fails to bind as uvicorn does, and lives on."""

    starts: list[int]

    def command(self) -> list[str]:
        self.starts.append(self.port)
        script = "import time; print('ERROR: address already in use', flush=True); time.sleep(60)"
        return [sys.executable, "-c", script]


def test_a_taken_port_is_retried_on_fresh_ports_then_reported(tmp_path) -> None:
    server = _Taken([], tmp_path / "server.log", start_timeout_s=50.0)
    server.starts = []
    with pytest.raises(PortTaken, match="taken"):
        server.start(tries=2)
    assert len(server.starts) == 2
    assert server.proc is None  # the second one was stopped too
