"""KV transfer benchmark: bandwidth and latency per backend and UCX transport, against an
in-process memory copy of the same bytes, plus the TTFT gain of per-layer sending.

    python bench/transfer/kv_transfer.py [--quick] [--out bench/results/transfer/kv_transfer.json]

Two processes per case (prefill sender, decode receiver), pinned to a core each.
Latency: one transfer at a time, timed from `send()` to its acknowledgement (median).
Bandwidth: sustained over ~512 MiB (8 to 1,000 transfers), with up to `WINDOW` transfers
in flight (as when several requests' layers move at once; the way ucx_perftest and
nixlbench measure bandwidth), bytes moved / wall time; the one-at-a-time figure (bytes /
latency) is reported beside it. "few" = one contiguous run of blocks (one region), "many"
= every other block (one region per 64 KiB block). TTFT: N layers of simulated compute (a
sleep: the CPU is free, as while a GPU computes), per-layer sends vs one send after the
last layer; exposed = TTFT - the same compute with no transfer (measured, as a sleep
overshoots); hidden = 1 - exposed_per_layer / exposed_after_last.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.paths import results_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

KiB, MiB = 1 << 10, 1 << 20
# 64 KiB blocks; 8192 of them so 256 MiB fits even as every other block.
BW_SPEC = dict(num_layers=1, num_blocks=8192, block_size=16, num_kv_heads=8, head_dim=128)
TTFT_SPEC = dict(num_layers=16, num_blocks=256, block_size=16, num_kv_heads=8, head_dim=128)
WINDOW = 8
STREAM_BYTES, STREAM_MIN, STREAM_MAX = 512 * MiB, 8, 1000  # transfers per sustained run
TLS = {
    ("nixl", "shm"): "sm,cma,tcp",
    ("nixl", "tcp"): "tcp",
    ("ucx", "shm"): "sm,cma,self",
    ("ucx", "tcp"): "tcp,self",
}


def child(
    conn: Connection,
    backend: str,
    tls: str,
    spec_kwargs: dict,
    cpu: int | None,
    loopback: bool = True,
) -> None:
    """One side of a pair: a transport over its own cache, answering the driver's commands
    on `conn`. `loopback`: keep UCX on 127.0.0.1 (both sides on this host)."""
    if cpu is not None:  # before any thread starts: they all inherit it
        os.sched_setaffinity(0, {cpu})
    if (backend, tls) in TLS:
        os.environ["UCX_TLS"] = TLS[(backend, tls)]
    import torch

    from core.kv_layout import KVLayout
    from engine import cpu_kernels
    from engine.kv_cache.shared_memory import shared_zeros
    from kv_transfer import Role, create_transport

    torch.set_num_threads(1)
    layout = KVLayout(**spec_kwargs)
    # In a memfd as the engine allocates it (the shm backend maps it); every page touched.
    kv = shared_zeros(layout.shape, torch.float16).fill_(1.0)
    transport = create_transport(
        kv, layout, "bench", backend=backend, loopback=loopback,
        block_copy=cpu_kernels.load("copy_blocks"),
    )  # fmt: skip
    conn.send(transport.local_metadata())
    peer = transport.add_peer(conn.recv())
    while True:
        command, *args = conn.recv()
        if command == "expect":
            for request_id, dst, num_layers in args[0]:
                transport.expect(request_id, dst, num_layers, timeout_s=120)
            conn.send(None)
        elif command == "transfer":  # sequential one-layer transfers, time each
            times = []
            for request_id, src, dst in args[0]:
                start = time.perf_counter()
                transport.send(request_id, src, peer, dst, [0], timeout_s=120).wait(120)
                times.append(time.perf_counter() - start)
                assert transport.wait(request_id, Role.SEND, 10).ok
            conn.send(times)
        elif command == "stream":  # up to `window` transfers in flight: sustained bandwidth
            jobs, window = args
            pending: collections.deque = collections.deque()
            start = time.perf_counter()
            for request_id, src, dst in jobs:
                if len(pending) >= window:
                    pending.popleft().wait(120)
                pending.append(transport.send(request_id, src, peer, dst, [0], timeout_s=120))
            while pending:
                pending.popleft().wait(120)
            elapsed = time.perf_counter() - start
            for request_id, _, _ in jobs:
                assert transport.wait(request_id, Role.SEND, 10).ok
            conn.send(elapsed)
        elif command == "ttft":
            request_id, src, dst, compute_s, mode = args
            start = time.perf_counter()
            handles = []
            for layer in range(layout.num_layers):
                time.sleep(compute_s)
                if mode == "per_layer":
                    handles.append(transport.send(request_id, src, peer, dst, [layer]))
            if mode == "after_last":
                handles.append(
                    transport.send(request_id, src, peer, dst, list(range(layout.num_layers)))
                )
            for handle in handles:
                handle.wait(120)
            conn.send(time.perf_counter() - start)
        elif command == "memcpy":
            nbytes, reps = args
            flat = kv.view(-1).view(torch.uint8)
            src, dst = flat[:nbytes], flat[nbytes : 2 * nbytes]
            dst.copy_(src)
            start = time.perf_counter()
            for _ in range(reps):
                dst.copy_(src)
            conn.send((time.perf_counter() - start) / reps)
        elif command == "exit":
            transport.close()
            conn.send(None)
            return


def side_cpus() -> list[int | None]:
    """Sender and receiver on a core each, as a prefill and a decode worker would be; the
    scheduler otherwise sometimes stacks the four threads on one core (measured: 1 MiB
    sustained 12-16 GB/s unpinned, 16-17 pinned)."""
    cpus = sorted(os.sched_getaffinity(0))
    return [cpus[side] if len(cpus) >= 2 else None for side in range(2)]


class Pair:
    """A sender (side 0) and a receiver (side 1), connected to each other; each is a
    process running `child` that answers on its connection."""

    def __init__(self, conns: list[Connection], procs: list[Any]) -> None:
        self.conns, self.procs = conns, procs
        sender_md, receiver_md = (c.recv() for c in self.conns)
        self.conns[0].send(receiver_md)
        self.conns[1].send(sender_md)

    @classmethod
    def local(cls, backend: str, tls: str, spec: dict) -> Pair:
        """Both sides on this host, children of this process."""
        ctx = mp.get_context("spawn")
        conns, procs = [], []
        for cpu in side_cpus():
            parent, child_conn = ctx.Pipe()
            proc = ctx.Process(
                target=child, args=(child_conn, backend, tls, spec, cpu), daemon=True
            )
            proc.start()
            conns.append(parent)
            procs.append(proc)
        return cls(conns, procs)

    def call(self, side: int, *command: Any) -> Any:
        self.conns[side].send(command)
        if not self.conns[side].poll(600):
            raise TimeoutError(command[0])
        return self.conns[side].recv()

    def close(self) -> None:
        for side in (0, 1):
            self.call(side, "exit")
        for (
            proc
        ) in self.procs:  # multiprocessing children, or subprocesses (bench/transfer/hosts.py)
            if isinstance(proc, mp.process.BaseProcess):
                proc.join(30)
            else:
                proc.wait(30)


def block_ids(num_blocks: int, pattern: str) -> list[int]:
    return list(range(num_blocks)) if pattern == "few" else list(range(0, 2 * num_blocks, 2))


def bench_bandwidth(pair: Pair, sizes: list[int], case: str) -> list[dict]:
    from core.kv_layout import KVLayout

    rows = []
    block_bytes = KVLayout(**BW_SPEC).block_bytes
    for size in sizes:
        reps = max(3, min(50, (64 * MiB) // size))
        # Sustained: long enough that filling and draining the window does not count.
        stream_n = min(STREAM_MAX, max(STREAM_MIN, STREAM_BYTES // size))
        memcpy_s = pair.call(0, "memcpy", size, reps)
        for pattern in ("few", "many"):
            ids = block_ids(size // block_bytes or 1, pattern)
            jobs = [(f"{case}-{size}-{pattern}-{i}", ids, ids) for i in range(reps + 1)]
            pair.call(1, "expect", [(r, dst, 1) for r, _, dst in jobs])
            times = pair.call(0, "transfer", jobs)[1:]  # first one warms up
            latency = statistics.median(times)
            stream = [(f"{case}-{size}-{pattern}-w{i}", ids, ids) for i in range(stream_n)]
            pair.call(1, "expect", [(r, dst, 1) for r, _, dst in stream])
            elapsed = pair.call(0, "stream", stream, WINDOW)
            nbytes = len(ids) * block_bytes
            sustained = nbytes * len(stream) / elapsed
            rows.append(
                dict(
                    case=case,
                    bytes=nbytes,
                    pattern=pattern,
                    regions=1 if pattern == "few" else len(ids),
                    latency_ms=latency * 1e3,
                    gbps_one_at_a_time=nbytes / latency / 1e9,
                    gbps=sustained / 1e9,
                    memcpy_gbps=nbytes / memcpy_s / 1e9,
                    vs_memcpy=sustained / (nbytes / memcpy_s),
                )
            )
            r = rows[-1]
            print(
                f"{case:10} {nbytes / KiB:>9.0f} KiB {pattern:4} {r['latency_ms']:9.3f} ms"
                f" {r['gbps_one_at_a_time']:7.2f} {r['gbps']:7.2f} GB/s"
                f"  memcpy {r['memcpy_gbps']:6.2f} GB/s  {100 * r['vs_memcpy']:5.1f}%",
                flush=True,
            )
    return rows


def bench_ttft(
    backend: str,
    tls: str,
    blocks_per_layer: int,
    compute_ms: float,
    make_pair: Callable[[str, str, dict], Pair] = Pair.local,
) -> dict:
    from core.kv_layout import KVLayout

    pair = make_pair(backend, tls, TTFT_SPEC)
    try:
        src = list(range(blocks_per_layer))
        dst = list(range(blocks_per_layer, 2 * blocks_per_layer))
        out: dict[str, Any] = dict(
            case=f"{backend}-{tls}",
            layers=TTFT_SPEC["num_layers"],
            compute_ms=compute_ms,
            bytes_per_layer=blocks_per_layer * KVLayout(**TTFT_SPEC).block_bytes,
        )
        # compute_only: the same sleeps with no transfer, measured (a sleep overshoots by a
        # fraction of a millisecond, which must not count as exposed transfer time).
        for mode in ("compute_only", "after_last", "per_layer"):
            runs = []
            for i in range(4):
                request_id = f"ttft-{mode}-{i}"
                if mode != "compute_only":
                    pair.call(1, "expect", [(request_id, dst, TTFT_SPEC["num_layers"])])
                runs.append(pair.call(0, "ttft", request_id, src, dst, compute_ms / 1e3, mode))
            out[f"ttft_{mode}_ms"] = statistics.median(runs[1:]) * 1e3
        compute_total = out["ttft_compute_only_ms"]
        exposed_end = out["ttft_after_last_ms"] - compute_total
        exposed_layer = out["ttft_per_layer_ms"] - compute_total
        out["compute_only_ms"] = compute_total
        out["hidden_fraction"] = 1 - max(exposed_layer, 0.0) / exposed_end
        return out
    finally:
        pair.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and cases")
    parser.add_argument("--cases", default="shm-map,nixl-shm,nixl-tcp,ucx-shm,ucx-tcp")
    parser.add_argument("--out", default=str(results_file("transfer", "kv_transfer.json")))
    args = parser.parse_args()
    sizes = [64 * KiB, MiB, 16 * MiB, 256 * MiB]
    cases = [tuple(c.split("-")) for c in args.cases.split(",")]
    if args.quick:
        sizes, cases = [64 * KiB, 16 * MiB], cases[:1]
    print(f"{'case':10} {'size':>13} {'kind':4} {'latency':>12} {'1-at-a-time':>7} {'window':>7}")
    rows = []
    for backend, tls in cases:
        pair = Pair.local(backend, tls, BW_SPEC)
        try:
            rows += bench_bandwidth(pair, sizes, f"{backend}-{tls}")
        finally:
            pair.close()
    big = [r for r in rows if r["bytes"] >= MiB]
    best_case = max(
        {r["case"] for r in big},
        key=lambda c: statistics.mean(r["vs_memcpy"] for r in big if r["case"] == c),
    )
    best_ratio = min(r["vs_memcpy"] for r in big if r["case"] == best_case)
    print(f"best backend {best_case}: >= {100 * best_ratio:.0f}% of memcpy for >= 1 MiB")
    ttft = bench_ttft(*best_case.split("-"), blocks_per_layer=64, compute_ms=4.0)
    print(
        f"TTFT {ttft['layers']} layers x {ttft['compute_ms']} ms compute, "
        f"{ttft['bytes_per_layer'] / MiB:.0f} MiB/layer ({ttft['case']}): compute only "
        f"{ttft['compute_only_ms']:.1f} ms, send after last {ttft['ttft_after_last_ms']:.1f} ms,"
        f" per-layer {ttft['ttft_per_layer_ms']:.1f} ms -> hidden "
        f"{100 * ttft['hidden_fraction']:.0f}%"
    )
    result = dict(
        bandwidth=rows,
        best_case=best_case,
        best_min_vs_memcpy_ge_1MiB=best_ratio,
        ttft=ttft,
        targets=dict(
            bandwidth_ge_50pct=best_ratio >= 0.5, hidden_ge_80pct=ttft["hidden_fraction"] >= 0.8
        ),
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
