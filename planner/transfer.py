"""How fast KV moves between two workers on this host: the measurement behind `baton
profile`'s transfer figures.

Two processes (spawned, as a cluster starts its workers), each holding a cache of the profiled
model's KV layout where the engine keeps it (on CPU in shared memory, on a GPU in its memory),
connected by the project's transport (kv_transfer) over the backend named: `shm` / `cuda_ipc` is
what a cluster's CPU / GPU workers on one host use, `nixl` / `ucx` what they use between hosts
(measured here over loopback). The receiver reserves blocks (`expect`) as a decode worker does;
for each block count the sender times one `send` of that many contiguous blocks, every layer at
once, to its acknowledgement (the receiver pulled them), `repeat` times after a warm-up; the
receiver then confirms every transfer landed. The fastest send of each size is fitted to time =
latency + bytes / bandwidth (core/perf `fit_transfer`).

A worker of TP t moves its KV as t rank pairs at once, each rank's heads to the matching
rank of the peer (worker/rank.py), so at TP t there are t pairs, each with one rank's share
of the layout, and each send is started on every pair together: its time is the slowest
pair's, its bytes every rank's (what the worker moves).

    pair 0: sender (rank 0's heads) --send n blocks--> receiver  -+  one sample: the
    pair 1: sender (rank 1's heads) --send n blocks--> receiver  -+  max time, summed bytes
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import platform
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

from core.kv_layout import KVLayout
from core.perf.fit import Sample, fit_transfer

BLOCK_COUNTS = (1, 4, 16, 64, 256)
MIN_LARGEST_BYTES = 32 << 20
"""The largest send moves at least this much (more blocks where a model's are small): the
bandwidth term must outgrow the latency's noise for the fit to separate them."""


@dataclass(frozen=True)
class Expect:
    """Receiver: reserve `block_ids` for each request."""

    request_ids: tuple[str, ...]
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class Send:
    """Sender: send `block_ids` (every layer) once per request, one at a time; answers the
    seconds each took to its acknowledgement."""

    request_ids: tuple[str, ...]
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class Landed:
    """Receiver: answers whether every request's KV landed (RECV ok)."""

    request_ids: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    """Either side: close the transport and exit."""


@dataclass(frozen=True)
class TransferProfile:
    """The measured transfer: the fit and the samples behind it."""

    backend: str
    host: str
    block_bytes: int
    """One block of every layer and every rank: what a request's block costs to move."""
    samples: list[Sample]
    """shape (bytes,), seconds: one send to its acknowledgement."""
    latency_ms: float
    gbps: float
    max_fit_error: float
    num_ranks: int = 1
    """Rank pairs sending at once (the worker's TP)."""

    @property
    def source(self) -> str:
        pairs = f", {self.num_ranks} rank pairs at once" if self.num_ranks > 1 else ""
        return f"measured over {self.backend} on {self.host}{pairs}"

    def sample_rows(self) -> list[dict[str, float]]:
        return [
            {"blocks": s.shape[0] // self.block_bytes, "bytes": s.shape[0],
             "ms": round(s.seconds * 1000, 4)}
            for s in self.samples
        ]  # fmt: skip


def _side(
    conn: Connection, backend: str, layout: KVLayout, model_id: str, timeout_s: float,
    device: str = "cpu",
) -> None:  # fmt: skip
    """One worker-like process: a transport over its own cache on `device`, answering
    commands on `conn` until Stop."""
    import time

    import torch

    from engine import cpu_kernels
    from engine.kv_cache.tensor import allocate_kv_cache
    from kv_transfer import Role, create_transport

    torch.set_num_threads(1)
    kv = allocate_kv_cache(layout, torch.device(device))
    kv.view(torch.uint8).fill_(1)  # every page touched, as a served cache's are
    transport = create_transport(
        kv, layout, model_id, backend=backend, loopback=True,
        block_copy=cpu_kernels.load("copy_blocks"),
    )  # fmt: skip
    layers = list(range(layout.num_layers))
    try:
        conn.send(transport.local_metadata())
        peer = transport.add_peer(conn.recv())
        while not isinstance(command := conn.recv(), Stop):
            if isinstance(command, Expect):
                for rid in command.request_ids:
                    transport.expect(rid, command.block_ids, layout.num_layers, timeout_s)
                conn.send(None)
            elif isinstance(command, Send):
                times = []
                for rid in command.request_ids:
                    ids = command.block_ids
                    start = time.perf_counter()
                    transport.send(rid, ids, peer, ids, layers, timeout_s).wait(timeout_s)
                    times.append(time.perf_counter() - start)
                    if not transport.wait(rid, Role.SEND, timeout_s).ok:
                        raise RuntimeError(f"send {rid} failed")
                conn.send(times)
            elif isinstance(command, Landed):
                results = [transport.wait(r, Role.RECV, timeout_s) for r in command.request_ids]
                conn.send(all(r.ok for r in results))
    finally:
        transport.close()


class _Pair:
    """A sender (0) and a receiver (1), each a spawned `_side`; `connect` joins them (apart
    from the start, so several pairs start their processes together)."""

    def __init__(
        self, backend: str, layout: KVLayout, model_id: str, timeout_s: float, device: str
    ) -> None:
        ctx = mp.get_context("spawn")
        self.timeout_s = timeout_s
        self.conns: list[Connection] = []
        self.procs = []
        for _ in range(2):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_side,
                args=(child, backend, layout, model_id, timeout_s, device),
                daemon=True,
            )
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def connect(self) -> None:
        sender, receiver = (self.collect(side) for side in (0, 1))
        self.conns[0].send(receiver)
        self.conns[1].send(sender)

    def collect(self, side: int):  # type: ignore[no-untyped-def]
        # Generous: a spawned side imports torch and may build the block copy first.
        if not self.conns[side].poll(self.timeout_s * 4):
            raise TimeoutError(f"transfer side {side} did not answer in {self.timeout_s * 4} s")
        try:
            return self.conns[side].recv()
        except EOFError:
            raise RuntimeError(f"transfer side {side} exited (its error is above)") from None

    def submit(self, side: int, command: object) -> None:
        self.conns[side].send(command)

    def call(self, side: int, command: object):  # type: ignore[no-untyped-def]
        self.submit(side, command)
        return self.collect(side)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):  # that side already ended
                conn.send(Stop())
        for proc in self.procs:
            proc.join(self.timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join(self.timeout_s)


def measure_transfer(
    layout: KVLayout,
    model_id: str,
    backend: str = "shm",
    block_counts: tuple[int, ...] = BLOCK_COUNTS,
    repeat: int = 5,
    timeout_s: float = 30.0,
    device: str = "cpu",
) -> TransferProfile:
    """Send each of `block_counts` blocks of `layout` (its block count is replaced by what
    the largest send needs) `repeat` times between two processes over `backend`, and fit.
    Counts four times the largest are added until one send moves MIN_LARGEST_BYTES. A
    layout of a tensor-parallel rank (`tp_size` t > 1) is measured as t pairs sending at
    once (the module docstring)."""
    num_ranks = layout.tp_size
    rank_block_bytes = layout.block_bytes_all_layers
    block_bytes = rank_block_bytes * num_ranks
    counts = sorted(set(block_counts))
    while counts[-1] * rank_block_bytes < MIN_LARGEST_BYTES:
        counts.append(counts[-1] * 4)
    layout = replace(layout, num_blocks=counts[-1])
    samples: list[Sample] = []
    pairs: list[_Pair] = []
    try:
        for rank in range(num_ranks):
            rank_layout = replace(layout, tp_rank=rank)
            pairs.append(_Pair(backend, rank_layout, model_id, timeout_s, device))
        for pair in pairs:
            pair.connect()
        for n in counts:
            ids = tuple(range(n))
            rids = tuple(f"measure-{n}-{i}" for i in range(repeat + 1))
            for pair in pairs:
                pair.call(1, Expect(rids, ids))
            for k, rid in enumerate(rids):
                for pair in pairs:  # every rank's send starts together, as a worker's do
                    pair.submit(0, Send((rid,), ids))
                seconds = max(pair.collect(0)[0] for pair in pairs)
                if k:  # the first one warms up
                    samples.append(Sample((n * block_bytes,), seconds))
            if not all(pair.call(1, Landed(rids)) for pair in pairs):
                raise RuntimeError(f"a transfer of {n} blocks did not land")
    finally:
        for pair in pairs:
            pair.close()
    fit = fit_transfer(samples)
    return TransferProfile(
        backend=backend,
        host=platform.node() or "this host",
        block_bytes=block_bytes,
        samples=samples,
        latency_ms=fit["transfer_latency_ms"],
        gbps=fit["transfer_gbps"],
        max_fit_error=fit["max_fit_error"],
        num_ranks=num_ranks,
    )
