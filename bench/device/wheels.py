"""The wheels the device check needs that the GPU host lacks, fetched here for its Python
(3.12, manylinux x86-64) into `.whl/`, to travel with the tree (at most 64 MiB a call, tree
and wheels together; the tree is ~8 MiB).

    python -m bench.device.wheels [--dir .whl] [--engine-only]

The host has torch, Triton, transformers, aiohttp and the like (the device notes' package
list); the engine also imports msgspec, gguf and the OpenTelemetry API / SDK, and `baton
serve` Ray, FastAPI / uvicorn / pydantic, jsonschema, grpcio and protobuf. Versions are the
ones installed here, so the device runs what the CPU suite tests.

Ray's wheel is 76 MiB; 31 MiB of it is the Java workers' jar (ray/jars), which a Python
cluster never loads, and 5 more its libraries (RLlib, Data, Train, Tune, LLM) and the
dashboard's web client, which Baton never imports or starts: it travels without them
(~39 MiB). grpcio and protobuf travel too (7 MiB): the generated stubs (proto/) refuse a
runtime older than the one that generated them, and the host's versions are not known. In
all, 28 wheels of 52.2 MiB.

A GPU cache moves between workers over NIXL or UCX only, and neither fits beside Ray: NIXL's
CUDA 13 wheel is 56 MiB (17 without its expert-parallel torch extensions and the plugins
Baton does not load), UCX's 43. So with these wheels a 1P+1D pair sharing the GPU moves its
KV over CUDA IPC (kv_transfer/cuda_ipc_driver.py); NIXL's own path waits for a host that has
it.

Checked here on Python 3.12 with these wheels over a bare environment given what they take
from the host (click, aiohttp, anyio, msgpack, psutil, pyyaml, requests, ...; EPYC Zen 5,
2026-12-07): the slimmed Ray starts a local cluster and runs an actor and a task (its
dashboard agent logs no error); fastapi, uvicorn, msgspec, the OpenTelemetry SDK and the
generated gRPC stubs import.

On the host, before the check:
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

ENGINE = ["msgspec", "gguf", "opentelemetry-api", "opentelemetry-sdk",
          "opentelemetry-semantic-conventions", "importlib-metadata", "xgrammar"]  # fmt: skip
SERVE = ["ray", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py",
         "fastapi", "starlette", "uvicorn", "pydantic", "pydantic-core", "annotated-types",
         "typing-inspection", "grpcio", "protobuf", "grpcio-health-checking",
         "grpcio-reflection", "redis",
         "opentelemetry-exporter-otlp-proto-grpc", "opentelemetry-exporter-otlp-proto-common",
         "opentelemetry-proto", "googleapis-common-protos"]  # fmt: skip
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]  # fmt: skip
CAP_MIB = 56
"""What the wheels may weigh: the call's 64 MiB less the tree."""
RAY_LEFT_OUT = ("ray/jars/", "ray/rllib/", "ray/data/", "ray/train/", "ray/tune/", "ray/llm/",
                "ray/dashboard/client/")  # fmt: skip
"""Folders of Ray's wheel a Python cluster without its dashboard never reads: the Java
workers' jar and Ray's libraries (the dashboard's web client among them)."""


def pinned(names: list[str]) -> list[str]:
    """Each at its version here; one not installed here (importlib-metadata, stdlib on this
    Python) at the newest."""
    out = []
    for name in names:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def download(requirements: list[str], folder: Path) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", *platforms, "--platform", "any",
         "-d", str(folder), *requirements],
        check=True,
    )  # fmt: skip


def slim_ray(wheel: Path) -> Path:
    """The wheel again without what a Python-only, dashboard-less cluster never reads (its
    RECORD rewritten to match), written over the original."""
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith(RAY_LEFT_OUT):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                kept = [ln for ln in lines if not ln.split(",")[0].startswith(RAY_LEFT_OUT)]
                data = "".join(kept).encode()
            dst.writestr(info, data)  # the same ZipInfo: executable bits kept
    slim.replace(wheel)
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(".whl"))
    parser.add_argument("--engine-only", action="store_true", help="not baton serve's")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    names = ENGINE if args.engine_only else ENGINE + SERVE
    download(pinned(names), args.dir)
    for wheel in args.dir.glob("ray-*.whl"):
        slim_ray(wheel)
    total = sum(p.stat().st_size for p in args.dir.glob("*.whl")) / 2**20
    print(f"{len(list(args.dir.glob('*.whl')))} wheels, {total:.1f} MiB in {args.dir}")
    if total > CAP_MIB:
        print(f"over {CAP_MIB} MiB: the tree and the wheels will not travel together")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
