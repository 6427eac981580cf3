"""A transport in a child process, driven command by command over a Pipe by the test
(`PipedProcess` drives other children the same way: a worker in tests/gpu).

Commands are tuples `(name, *args)`; every command gets one reply `("ok", value)` or
`("error", message)`. Caches are filled from a seed, so the test can rebuild them.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

# UCX_TLS per (backend, transport). NIXL's UCX backend refuses a transport list without tcp
# (it needs it for its error-handling wireup); UCX still moves the bytes over cma then.
TLS_CHOICES = {
    ("nixl", "shm"): "sm,cma,tcp",
    ("ucx", "shm"): "sm,cma,self",
    ("nixl", "tcp"): "tcp",
    ("ucx", "tcp"): "tcp,self",
}


def make_cache(layout_kwargs: dict[str, Any], seed: int, shared: bool = False) -> Any:
    """The cache a seed fills; `shared` puts it in a memfd, as the engine does on CPU (the
    `shm` backend needs that)."""
    import torch

    from core.kv_layout import KVLayout
    from engine.kv_cache.shared_memory import shared_zeros

    layout = KVLayout(**layout_kwargs)
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(layout.shape, generator=gen, dtype=torch.float32).to(
        getattr(torch, layout.dtype)
    )
    if shared:
        kv = shared_zeros(tuple(kv.shape), kv.dtype).copy_(kv)
    return layout, kv


def peer_main(conn: Connection, backend: str, tls: str, layout_kwargs: dict, seed: int) -> None:
    if (backend, tls) in TLS_CHOICES:
        os.environ["UCX_TLS"] = TLS_CHOICES[(backend, tls)]
    import torch

    from engine import cpu_kernels
    from kv_transfer import Role, create_transport

    torch.set_num_threads(1)
    layout, kv = make_cache(layout_kwargs, seed, shared=backend in ("shm", "auto"))
    failures: list[dict] = []
    transport = create_transport(
        kv,
        layout,
        "test-model",
        backend=backend,
        loopback=True,
        on_failure=lambda r: failures.append(asdict(r)),
        block_copy=cpu_kernels.load("copy_blocks"),
    )
    handles: dict[tuple[str, tuple[int, ...]], Any] = {}
    conn.send((transport.name, transport.local_metadata()))
    while True:
        command, *args = conn.recv()
        try:
            if command == "add_peer":
                value: Any = transport.add_peer(args[0])
            elif command == "expect":
                value = transport.expect(*args)
            elif command == "send":
                request_id, src, peer, dst, layers, timeout_s = args
                handle = transport.send(request_id, src, peer, dst, layers, timeout_s)
                handles[(request_id, tuple(layers))] = handle
                value = None
            elif command == "wait_handle":
                request_id, layers, timeout_s = args
                handles[(request_id, tuple(layers))].wait(timeout_s)
                value = None
            elif command == "wait":
                request_id, role, timeout_s = args
                result = transport.wait(request_id, Role(role), timeout_s)
                value = asdict(result) | {"role": result.role.value}
            elif command == "peer_backends":  # auto: which backend each peer is reached over
                value = dict(transport.peer_backends)
            elif command == "failures":
                value = [f | {"role": f["role"].value} for f in failures]
            elif command == "cache":
                value = kv.view(torch.uint8).numpy().copy()
            elif command == "exit":
                transport.close()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command {command}")
            conn.send(("ok", value))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class PipedProcess:
    """Test-side handle of a child process (spawn) that greets with `(name, metadata)`, then
    answers every command tuple with `("ok", value)` or `("error", message)`; "exit" ends
    it. `target(conn, *args)` is the child's body (`peer_main` here; a worker elsewhere)."""

    def __init__(self, target: Callable[..., None], args: tuple, start_timeout_s: float = 60.0):
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child_conn, *args), daemon=True)
        self.process.start()
        self.name, self.metadata = self._receive("start", start_timeout_s)

    def _receive(self, what: str, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while not self.conn.poll(0.1):
            if not self.process.is_alive():
                raise RuntimeError(f"peer process died during {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"peer did not answer {what}")
        return self.conn.recv()

    def call(self, *command: Any, timeout_s: float = 30.0) -> Any:
        self.conn.send(command)
        status, value = self._receive(command[0], timeout_s)
        if status != "ok":
            raise RuntimeError(value)
        return value

    def kill(self) -> None:
        self.process.kill()
        self.process.join(10)

    def stop(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(Exception):
                self.call("exit", timeout_s=15)
            self.process.join(10)
        if self.process.is_alive():
            self.kill()


class Peer(PipedProcess):
    """A transport in a child process (`peer_main`)."""

    def __init__(self, backend: str, tls: str, layout_kwargs: dict, seed: int) -> None:
        self.backend = backend
        super().__init__(peer_main, (backend, tls, layout_kwargs, seed))
