"""Several hosts on one machine: Linux network namespaces on a bridge, one Ray node each.

    namespace <id>sw:  bridge br0 ------------------------------------------------.
    namespace <id>h1:  eth0 10.213.<n>.1   Ray head (GCS, the Baton controller)    |
    namespace <id>h2:  eth0 10.213.<n>.2   Ray node ...                            |-- veth
    ...                                                                            |
                                                                                  -'
Every process of the bed is started inside its host's namespace (`ip netns exec`), in a new
session, with an environment built here (Ray token authentication on, UCX over TCP on the
hosts' interfaces; nothing inherited that would pin it to loopback). A host's processes,
and any they spawned, are found with `ip netns pids` and killed by PID: stopping a host is
exactly losing it. Teardown kills every process of every namespace of the bed, then
deletes the namespaces; it runs on exit, also when a test fails. Only addresses inside
namespaces the bed made are used; the machine's own network is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GCS_PORT = 6379


def can_make_namespaces() -> str | None:
    """None if this process may build a bed; else why not (the tests skip with it)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"bprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    subprocess.run(command, check=True, capture_output=True, text=True)


class Bed:
    """`num_hosts` hosts h1..hN on 10.213.<subnet>.0/24; use as a context manager."""

    def __init__(self, num_hosts: int, subnet: int = 0) -> None:
        self.num_hosts = num_hosts
        self.prefix = f"bt{os.getpid() % 100000}"
        self.subnet = subnet
        self.token = secrets.token_hex(32)
        self.root = Path(f"/tmp/baton-bed-{self.prefix}")
        self.logs = Path("/tmp/baton-bed-logs")
        """Kept after teardown (the last bed's) for a look after a failure."""
        self._procs: list[subprocess.Popen[bytes]] = []

    def ns(self, host: int) -> str:
        return f"{self.prefix}h{host}"

    def address(self, host: int) -> str:
        return f"10.213.{self.subnet}.{host}"

    @property
    def gcs(self) -> str:
        return f"{self.address(1)}:{GCS_PORT}"

    # -- the network ------------------------------------------------------------------
    def __enter__(self) -> Bed:
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.teardown()

    def _build(self) -> None:
        shutil.rmtree(self.logs, ignore_errors=True)
        self.logs.mkdir(parents=True)
        switch = f"{self.prefix}sw"
        _ip("netns", "add", switch)
        _ip("link", "add", "br0", "type", "bridge", netns=switch)
        _ip("link", "set", "br0", "up", netns=switch)
        for host in range(1, self.num_hosts + 1):
            ns, outer, inner = self.ns(host), f"{self.prefix}p{host}", f"{self.prefix}v{host}"
            _ip("netns", "add", ns)
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "netns", switch)
            _ip("link", "set", outer, "master", "br0", netns=switch)
            _ip("link", "set", outer, "up", netns=switch)
            _ip("link", "set", inner, "name", "eth0", netns=ns)
            _ip("addr", "add", f"{self.address(host)}/24", "dev", "eth0", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)

    def namespaces(self) -> list[str]:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        names = [line.split()[0] for line in listed.splitlines() if line.strip()]
        return [n for n in names if n.startswith(self.prefix)]

    def pids(self, ns: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def stop_host(self, host: int) -> None:
        """Lose a host: SIGKILL every process in its namespace, at once."""
        self._kill_namespace(self.ns(host))

    def _kill_namespace(self, ns: str) -> None:
        for _ in range(5):  # a process may fork while we kill: look again
            pids = self.pids(ns)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)

    def teardown(self) -> None:
        for ns in self.namespaces():
            self._kill_namespace(ns)
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.wait(5)
        for ns in self.namespaces():
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- processes ----------------------------------------------------------------------
    def env(self, host: int) -> dict[str, str]:
        """What every process of `host` runs with: the suite's loopback settings removed,
        Ray's token auth on, UCX over TCP on the hosts' interface (so KV really crosses
        the bridge rather than taking a same-kernel shortcut), and the host's address for
        a Baton front door's driver (the hosts share one filesystem, where Ray would find
        the head's cached address and hand it to a driver on any host)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "UCX_", "GLOO_"))}
        env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            RAY_USAGE_STATS_ENABLED="0",
            UCX_TLS="tcp",
            UCX_NET_DEVICES="eth0",
            GLOO_SOCKET_IFNAME="eth0",
            PYTHONPATH=str(REPO),
            PYTHONUNBUFFERED="1",
            TOKENIZERS_PARALLELISM="false",
            BATON_NODE_IP=self.address(host),
        )
        return env

    def spawn(
        self, host: int, args: list[str], log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `args` inside host `host`, in its own session, with `env` added to the bed's;
        output into logs/<log>."""
        out = open(self.logs / log, "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(host), *args],
            stdout=out, stderr=subprocess.STDOUT, env={**self.env(host), **(env or {})},
            cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
        out.close()
        self._procs.append(proc)
        return proc

    def run(self, host: int, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Run `args` inside host `host` to the end (bounded by `timeout_s`)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(host), *args],
            capture_output=True, text=True, env=self.env(host), cwd=REPO, timeout=timeout_s,
        )  # fmt: skip

    def start_ray(self, host: int, num_cpus: int, resources: dict[str, float]) -> None:
        """A Ray node on `host` (the head on host 1), with its own temp dir."""
        args = [
            "ray", "start", "--node-ip-address", self.address(host), "--num-cpus",
            str(num_cpus), "--resources", json.dumps(resources), "--disable-usage-stats",
            "--temp-dir", str(self.root / f"ray-h{host}"), "--block",
        ]  # fmt: skip
        if host == 1:
            args += ["--head", "--port", str(GCS_PORT), "--include-dashboard=false"]
        else:
            args += ["--address", self.gcs]
        self.spawn(host, args, f"ray-h{host}.log")

    def wait_for_nodes(self, count: int, timeout_s: float = 120.0) -> None:
        script = (
            "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR');"
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        deadline = time.monotonic() + timeout_s
        seen = ""
        while time.monotonic() < deadline:
            done = self.run(1, [sys.executable, "-c", script, self.gcs], 60)
            seen = (done.stdout.strip().splitlines() or [""])[-1]
            if seen.isdigit() and int(seen) >= count:
                return
            time.sleep(1.0)
        raise TimeoutError(f"{count} Ray nodes did not come up (last count {seen!r})")

    def wait_http(self, host: int, port: int, timeout_s: float = 300.0) -> None:
        url = f"http://{self.address(host)}:{port}/health"
        script = "import httpx, sys; sys.exit(httpx.get(sys.argv[1], timeout=2).status_code != 200)"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                if self.run(host, [sys.executable, "-c", script, url], 10).returncode == 0:
                    return
            time.sleep(1.0)
        raise TimeoutError(f"no healthy front door at {url}; logs in {self.logs}")

    def log_text(self, name: str) -> str:
        path = self.logs / name
        return path.read_text(errors="replace") if path.exists() else ""

    def session_logs(self, host: int) -> Iterator[Path]:
        """Ray's worker logs of `host`."""
        yield from (self.root / f"ray-h{host}").glob("session_*/logs/*")


def client(bed: Bed, host: int, command: str, wait_s: float = 360.0, **kwargs: Any) -> Any:
    """Run tests/multinode/client.py `command` (with `kwargs`) inside `host`, for at most
    `wait_s`; its JSON answer."""
    args = [sys.executable, "-m", "tests.multinode.client", command, json.dumps(kwargs)]
    done = bed.run(host, args, timeout_s=wait_s)
    if done.returncode != 0:
        raise RuntimeError(f"client {command} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])
