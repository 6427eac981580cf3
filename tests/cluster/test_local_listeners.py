"""A local `baton serve` (no --address) is reachable from this machine only: every socket
its process tree listens on (front doors, Ray's GCS, raylet, object store, workers, KV
transports) is bound to loopback. Run with an environment free of the suite's own Ray and UCX
settings, so what is checked is what `baton serve` sets up itself."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.multinode.bed import REPO

pytestmark = pytest.mark.slow
LOOPBACK = ("127.0.0.1", "[::1]", "[::ffff:127.0.0.1]")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def listeners(session: int) -> list[tuple[str, int]]:
    """(local address, pid) of every TCP socket a process of `session` listens on."""
    found = []
    for line in subprocess.run(
        ["ss", "-ltnpH"], capture_output=True, text=True
    ).stdout.splitlines():
        fields = line.split()
        address = fields[3].rpartition(":")[0]
        for part in line.split("pid=")[1:]:
            pid = int(part.split(",")[0])
            if session_of(pid) == session:
                found.append((address, pid))
    return found


def serving(tmp_path: Path, model: Path, env: dict[str, str]) -> subprocess.Popen:
    """`baton serve` up on free ports; started again on others when one was taken between
    the choice and the bind (by another process of this machine's, or of its own Ray)."""
    for attempt in range(3):
        port, grpc_port = free_port(), free_port()
        log_path = tmp_path / f"serve-{attempt}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - the child owns it
        server = subprocess.Popen(
            [sys.executable, "-m", "router.cli", "serve", "--model", str(model),
             "--port", str(port), "--grpc-port", str(grpc_port), "--kv-cache-gb", "0.05"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and server.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return server
            time.sleep(1)
        stop(server)
        text = log_path.read_text()
        assert "address already in use" in text, text[-3000:]
    raise AssertionError("three ports in a row were taken before baton serve bound them")


def stop(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)  # what is left of the group we started


def test_a_local_cluster_listens_on_loopback_only(tmp_path: Path, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "UCX_", "GLOO_"))}
    server = serving(tmp_path, tiny_model_dir("llama"), env)
    try:
        found = listeners(server.pid)  # the server leads its session: its pid is the id
        pids = {pid for _, pid in found}
        assert len(pids) >= 3, f"expected the front door and Ray's processes, got {found}"
        exposed = [(address, pid) for address, pid in found if address not in LOOPBACK]
        assert not exposed, f"listening beyond loopback: {exposed}"
    finally:
        stop(server)


@pytest.mark.parametrize("door", ["HTTP", "gRPC"])
def test_a_taken_port_ends_baton_serve_with_an_error(
    door: str, tmp_path: Path, tiny_model_dir
) -> None:  # type: ignore[no-untyped-def]
    """uvicorn exits from inside its task when it cannot bind, grpcio raises; either way the
    server closes its cluster and exits non-zero, naming the address, instead of staying up
    on the cluster's threads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "UCX_", "GLOO_"))}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = [str(port), str(free_port())] if door == "HTTP" else [str(free_port()), str(port)]
        server = subprocess.Popen(
            [sys.executable, "-m", "router.cli", "serve", "--model", str(tiny_model_dir("llama")),
             "--port", ports[0], "--grpc-port", ports[1], "--kv-cache-gb", "0.05"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
        try:
            out, _ = server.communicate(timeout=240)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)  # what is left of the group we started
    assert server.returncode != 0
    assert f"could not serve {door} on 127.0.0.1:{port}" in out.decode(errors="replace")
