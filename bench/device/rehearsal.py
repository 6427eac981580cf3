"""The device check rehearsed on this host in an environment like the GPU host's, so that
what the host lacks shows before a lease is spent finding it.

    python -m bench.device.rehearsal [--python python3.12] [--venv DIR] [--site DIR]

1. A Python 3.12 virtual environment (made once, kept at `--venv`) holding the host's
   packages at its versions (`wheels.HOST_PINNED`) and the others of `wheels.HOST` that
   Baton imports, nothing else: not this host's site-packages.
2. The wheels `bench.device.wheels` fetches, installed into `--site` the way the device's
   command installs them (`pip --target`), first on PYTHONPATH.
3. The device check's dry run (tests/bench/test_device_check.py) in that environment.

Triton: the host's 3.6.0 compiles the kernels, but its interpreter, which the dry run
runs them under, fails on them (a loop bound there is an array of one element, which numpy 2
will not take as an index). So the environment gets this host's Triton over it;
`tests.support.hopper_compile` under 3.6.0 checks the compile for sm_90.

The first run downloads torch and its CUDA libraries (~3 GB) and takes ~10 minutes on two
cores; later runs reuse the environment.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from bench.device import wheels

ROOT = Path(__file__).resolve().parents[2]


def host_requirements() -> list[str]:
    """What the environment installs: the host's pinned packages, then the rest unpinned (the
    host's versions of those are not known); Triton comes with torch."""
    pinned = [f"{name}=={version}" for name, version in wheels.HOST_PINNED.items()]
    return pinned + sorted(wheels.HOST - set(wheels.HOST_PINNED))


def make_venv(python: str, venv: Path) -> Path:
    """The environment's interpreter, made and filled unless an earlier run finished it."""
    bin_python, ready = venv / "bin" / "python", venv / "baton-host-ready"
    if ready.exists():
        return bin_python
    subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(bin_python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *host_requirements()], check=True)
    # This host's Triton for its interpreter, without its requirements (torch stays 2.11).
    triton = metadata.version("triton")
    subprocess.run([*pip, "--no-deps", "--force-reinstall", f"triton=={triton}"], check=True)
    ready.touch()
    return bin_python


def install_wheels(bin_python: Path, folder: Path, site: Path) -> None:
    if wheels.main(["--dir", str(folder)]) != 0:
        raise SystemExit("the wheels do not fit beside the tree")
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run(
        [str(bin_python), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
         *map(str, sorted(folder.glob("*.whl")))],
        check=True,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--python", default="python3.12", help="a Python 3.12 interpreter")
    p.add_argument("--venv", type=Path, default=Path("/tmp/baton-device-host"))
    p.add_argument("--site", type=Path, default=Path("/tmp/baton-device-site"))
    p.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    args = p.parse_args(argv)
    python = shutil.which(args.python) or args.python
    try:
        version = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        raise SystemExit(f"--python {args.python}: no interpreter runs there ({e})") from e
    if version.stdout.strip() != "(3, 12)":
        raise SystemExit(f"--python {args.python} is Python {version.stdout.strip()}, not 3.12")
    bin_python = make_venv(python, args.venv)
    install_wheels(bin_python, args.wheels, args.site)
    env = {**os.environ, "PYTHONPATH": f"{args.site}:{ROOT}", "TRITON_INTERPRET": "1",
           "PATH": f"{bin_python.parent}:{os.environ['PATH']}"}  # fmt: skip
    test = [str(bin_python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
            "tests/bench/test_device_check.py"]  # fmt: skip
    return subprocess.run(test, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
