"""Across hosts against one host, in one run: KV transfer and P/D serving.

    python -m bench.transfer.hosts [--quick] [--out bench/results/transfer/hosts.json]

Hosts are Linux network namespaces on a bridge (tests/multinode/bed.py; needs root): every
byte between two of them crosses a veth pair and the kernel's TCP stack, as it would cross a
NIC, though here both ends share this machine's two cores (a real second host brings its
own). Two parts:

1. KV transfer (bench/transfer/kv_transfer.py's pairs): sustained bandwidth and latency per backend,
   sender and receiver on two hosts (nixl and ucx over TCP) against both on one host
   (the shm backend, and nixl / ucx through the kernel's cma), and the share of a 16-layer
   TTFT the transfer adds when sent layer by layer.
2. P/D serving, 1 prefill + 1 decode worker: on two hosts against on one host (the same
   Ray cluster shape, a front door on a third), the long-prompt mix at a few rates with
   loadgen/cli.py's client: TTFT, TPOT, throughput and the KV transfer's share of TTFT.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

from bench.paths import results_file
from bench.transfer.kv_transfer import (
    BW_SPEC,
    KiB,
    MiB,
    Pair,
    bench_bandwidth,
    bench_ttft,
    side_cpus,
)
from tests.multinode.bed import Bed, can_make_namespaces

ONE_HOST = ("shm-map", "nixl-shm", "ucx-shm")
TWO_HOSTS = ("nixl-tcp", "ucx-tcp")
SERVE_RATES = (1.0, 2.0)


def hosts_pair(bed: Bed, hosts: tuple[int, int], backend: str, tls: str, spec: dict) -> Pair:
    """A sender on `hosts[0]` and a receiver on `hosts[1]` of the bed."""
    key = secrets.token_bytes(16)
    path = os.path.join(tempfile.mkdtemp(prefix="baton-kv-"), "driver.sock")
    listener = Listener(path, family="AF_UNIX", authkey=key)
    procs = []
    for side, (host, cpu) in enumerate(zip(hosts, side_cpus(), strict=True)):
        args = dict(backend=backend, tls=tls, spec_kwargs=spec, cpu=cpu, loopback=False)
        command = [
            sys.executable,
            "-m",
            "bench.transfer.kv_peer",
            path,
            str(side),
            json.dumps(args),
        ]
        procs.append(bed.spawn(host, command, f"kv-{backend}-{side}.log",
                               env={"BATON_BENCH_KEY": key.hex()}))  # fmt: skip
    conns: list[Any] = [None, None]
    for _ in range(2):
        conn = listener.accept()
        conns[conn.recv()] = conn
    listener.close()
    return Pair(conns, procs)


def kv_part(quick: bool) -> dict[str, Any]:
    sizes = [MiB, 16 * MiB] if quick else [64 * KiB, MiB, 16 * MiB, 256 * MiB]
    rows: list[dict] = []
    ttft: dict[str, dict] = {}
    for case in ONE_HOST:
        backend, tls = case.split("-")
        pair = Pair.local(backend, tls, BW_SPEC)
        try:
            rows += [r | {"hosts": 1} for r in bench_bandwidth(pair, sizes, case)]
        finally:
            pair.close()
    ttft["one host (shm-map)"] = bench_ttft("shm", "map", 64, 4.0)
    with Bed(num_hosts=2, subnet=1) as bed:
        for case in TWO_HOSTS:
            backend, tls = case.split("-")
            pair = hosts_pair(bed, (1, 2), backend, tls, BW_SPEC)
            try:
                rows += [r | {"hosts": 2} for r in bench_bandwidth(pair, sizes, case)]
            finally:
                pair.close()
        ttft["two hosts (nixl-tcp)"] = bench_ttft(
            "nixl", "tcp", 64, 4.0, lambda b, t, spec: hosts_pair(bed, (1, 2), b, t, spec)
        )
    return {"bandwidth": rows, "ttft": ttft}


def serve_layout(layout: str, model_dir: Path, rates: list[float], num_requests: int) -> dict:
    """1 prefill + 1 decode worker on two hosts (h2, h3) or on one (h2), a front door on the
    head (h1); loadgen/cli.py's client from the head."""
    with Bed(num_hosts=3, subnet=2 if layout == "two hosts" else 3) as bed:
        bed.start_ray(1, num_cpus=1, resources={})
        if layout == "two hosts":
            bed.start_ray(2, num_cpus=2, resources={"prefill": 1})
            bed.start_ray(3, num_cpus=2, resources={"decode": 1})
        else:
            bed.start_ray(2, num_cpus=2, resources={"prefill": 1, "decode": 1})
        bed.wait_for_nodes(3 if layout == "two hosts" else 2)
        url = f"http://{bed.address(1)}:8000"
        bed.spawn(1, [
            sys.executable, "-m", "router.cli", "serve", "--address", bed.gcs,
            "--host", bed.address(1), "--port", "8000", "--grpc-port", "50051",
            "--model", str(model_dir), "--prefill", "1", "--decode", "1",
            "--kv-cache-gb", "0.25", "--threads", "1", "--max-num-seqs", "32",
        ], "frontdoor.log")  # fmt: skip
        bed.wait_http(1, 8000)
        out = bed.root / "serve.json"
        done = bed.run(1, [
            sys.executable, "-m", "loadgen", "--url", url, "--workload", "long_mix",
            "--rate", *map(str, rates), "--num-requests", str(num_requests),
            "--duration", "40", "--no-progress", "--out", str(out),
        ], timeout_s=1800)  # fmt: skip
        print(done.stdout[-3000:], flush=True)
        if done.returncode != 0:
            raise RuntimeError(f"baton bench failed in the bed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def serve_part(quick: bool) -> dict[str, Any]:
    from loadgen.compare import ensure_bench_model

    model_dir = ensure_bench_model(None)
    rates = list(SERVE_RATES[:1] if quick else SERVE_RATES)
    return {
        layout: serve_layout(layout, model_dir, rates, 20 if quick else 60)
        for layout in ("one host", "two hosts")
    }


def report(result: dict[str, Any]) -> None:
    kv = result.get("kv", {"bandwidth": [], "ttft": {}})
    print(f"\n{'case':10} {'hosts':>5} {'size':>10} {'pattern':7} {'GB/s':>7} {'latency ms':>11}")
    for r in kv["bandwidth"]:
        print(f"{r['case']:10} {r['hosts']:5d} {r['bytes'] / MiB:8.2f}Mi {r['pattern']:7}"
              f" {r['gbps']:7.2f} {r['latency_ms']:11.3f}")  # fmt: skip
    for name, t in kv["ttft"].items():
        print(f"TTFT {name}: compute {t['compute_only_ms']:.1f} ms, per-layer sends "
              f"{t['ttft_per_layer_ms']:.1f} ms, after the last layer {t['ttft_after_last_ms']:.1f}"
              f" ms: {100 * t['hidden_fraction']:.0f}% of the transfer hidden")  # fmt: skip
    for layout, served in result.get("serve", {}).items():
        for s in served["runs"]:
            print(f"serve {layout:9} {s['rate']:4.1f} req/s: TTFT mean "
                  f"{1000 * s['ttft_s']['mean']:6.0f} ms, TPOT p50 {1000 * s['tpot_s']['p50']:5.1f}"
                  f" ms, {s['output_tokens_per_s']:6.1f} tok/s, KV share of TTFT "
                  f"{s['kv_transfer_share_of_ttft'] or 0:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="kv,serve")
    parser.add_argument("--out", default=str(results_file("transfer", "hosts.json")))
    args = parser.parse_args()
    why = can_make_namespaces()
    if why is not None:
        raise SystemExit(f"bench.transfer.hosts: {why}")
    result: dict[str, Any] = {}
    if "kv" in args.parts:
        result["kv"] = kv_part(args.quick)
    if "serve" in args.parts:
        result["serve"] = serve_part(args.quick)
    report(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
