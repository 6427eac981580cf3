"""The wheels the device check needs that the GPU host lacks, fetched here for its Python
(3.12, manylinux x86-64) into `.whl/`, to travel with the tree (at most 64 MiB a call, tree
and wheels together; the tree is ~8 MiB).

    python -m bench.device.wheels [--dir .whl] [--engine-only]

The host has torch, Triton, transformers and what its packages require (`HOST`: the
device notes' package list, closed over its requirements). Everything else Baton imports
travels (`ENGINE`, `SERVE`): the engine's msgspec, gguf, xxhash and the OpenTelemetry API /
SDK; `tests/gpu`'s pytest and peft (the LoRA oracle); and `baton serve`'s Ray with msgpack,
FastAPI / uvicorn / pydantic, prometheus-client, jsonschema, grpcio, protobuf and the OTLP
exporter. The host has pydantic and protobuf as well; they travel all the same, at the
versions the CPU suite tests, as every wheel here does. tests/bench/test_device_wheels.py
holds each import of Baton's, and each requirement of a travelling wheel, to one of the
lists (`HOST`, `ENGINE`, `SERVE`, `OPTIONAL`).

Ray's wheel is 76 MiB; 31 MiB of it is the Java workers' jar (ray/jars), which a Python
cluster never loads, and 5 more its libraries (RLlib, Data, Train, Tune, LLM) and the
dashboard's web client, which Baton never imports or starts: it travels without them
(~39 MiB). grpcio and protobuf travel too (7 MiB): the generated stubs (proto/) refuse a
runtime older than the one that generated them, and the host's versions are not known. In
all, 36 wheels of 53.1 MiB.

A GPU cache moves between workers over NIXL or UCX only, and neither fits beside Ray: NIXL's
CUDA 13 wheel is 56 MiB (17 without its expert-parallel torch extensions and the plugins
Baton does not load), UCX's 43. So with these wheels a 1P+1D pair sharing the GPU moves its
KV over CUDA IPC (kv_transfer/cuda_ipc_driver.py); NIXL's own path waits for a host that has
it.

`python -m bench.device.rehearsal` runs the device check's dry run here in an environment
like the host's: Python 3.12, the host's packages, these wheels on PYTHONPATH.

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

ENGINE = ["msgspec", "gguf", "xxhash", "opentelemetry-api", "opentelemetry-sdk",
          "opentelemetry-semantic-conventions", "importlib-metadata",
          "pytest", "pluggy", "iniconfig", "pytest-timeout", "peft"]  # fmt: skip
SERVE = ["ray", "msgpack", "prometheus-client", "jsonschema", "jsonschema-specifications",
         "referencing", "rpds-py", "fastapi", "starlette", "uvicorn", "pydantic",
         "pydantic-core", "annotated-types", "typing-inspection", "grpcio", "protobuf",
         "grpcio-health-checking", "grpcio-reflection", "redis",
         "opentelemetry-exporter-otlp-proto-grpc", "opentelemetry-exporter-otlp-proto-common",
         "opentelemetry-exporter-otlp-common", "opentelemetry-proto",
         "googleapis-common-protos"]  # fmt: skip
HOST_PINNED = {"torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0",
               "tokenizers": "0.23.2", "safetensors": "0.8.0", "huggingface-hub": "1.33.0",
               "numpy": "2.5.2", "accelerate": "1.15.0"}  # fmt: skip
"""The host's packages Baton imports, at the versions the device notes' pip list gives."""
HOST = frozenset(HOST_PINNED) | {
    "jinja2", "aiohttp", "click", "httpx", "psutil", "pyyaml", "requests", "tqdm", "filelock",
    "fsspec", "packaging", "regex", "sympy", "networkx", "typing-extensions",
    "pydantic", "protobuf", "anyio", "certifi", "idna", "attrs", "h11", "pygments",
    "annotated-doc", "ninja",
}  # fmt: skip
"""Distributions Baton may import that the GPU host has: its image's listed packages and what
they require (pip's resolution of that list for Python 3.12: aiohttp comes with
pytorch-lightning's fsspec[http], httpx with huggingface-hub). Not msgpack,
prometheus-client, pytest or matplotlib. xxhash comes with torch-geometric, a package Baton
does not use: it travels."""
OPTIONAL = frozenset({"xgrammar", "matplotlib", "playwright", "flash-attn", "nixl",
                      "ucxx-cu12", "grpcio-tools", "hypothesis"})  # fmt: skip
"""Imported only where they are present, or by code the device check never runs: the grammar
compiler (at a server's first constrained request: the check sends none, and xgrammar with
the tvm-ffi it needs, 4.4 MiB, does not fit beside Ray), a plot, a screenshot, a peer
kernel, the transports NIXL and UCX (a host without them moves KV over CUDA IPC), the
stubs' generator, the fuzz tests."""
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
