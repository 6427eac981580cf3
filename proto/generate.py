"""Regenerate the Python stubs of `proto/baton/v1/*.proto` with grpcio-tools.

    python -m proto.generate            # rewrite the checked-in stubs
    python -m proto.generate --check    # exit 1 if they are stale

Protos are compiled with the repository root as include path, so the stubs import each
other as `proto.baton.v1.*` and work from the installed package.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO_ROOT / "proto" / "baton" / "v1"
# Suffixes grpcio-tools writes per .proto file; each is checked in beside the .proto.
STUB_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Compile every proto into `out_root` (mirroring the repo layout); returns the stubs."""
    from grpc_tools import protoc  # build-time tool: imported only here

    rel = [str(p.relative_to(REPO_ROOT)) for p in proto_files()]
    args = [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *rel,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {rel}")
    return sorted((out_root / PROTO_DIR.relative_to(REPO_ROOT)).glob("*_pb2*"))


def stale_stubs() -> list[str]:
    """Names of stubs that differ from a fresh generation (or are missing / extra)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        present = {p.name: p for p in PROTO_DIR.iterdir() if p.name.endswith(STUB_SUFFIXES)}
        names = sorted(set(fresh) | set(present))
        return [
            n
            for n in names
            if n not in fresh or n not in present or not filecmp.cmp(fresh[n], present[n], False)
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale stubs")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_stubs()
        for name in stale:
            print(f"stale: proto/baton/v1/{name} (run python -m proto.generate)")
        return 1 if stale else 0
    for path in generate(REPO_ROOT):
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
