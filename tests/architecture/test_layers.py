"""The package map of docs/architecture.md, checked against the code: every import points
down the layers, no import circles, small files, and the packages that must stay free of
torch or Ray are."""

from __future__ import annotations

import sys

import pytest

from tests.architecture.imports import (
    ROOT,
    cycles,
    is_generated,
    module_graph,
    product_files,
    third_party,
)

MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "proto": set(),
    "engine": {"core"},
    "kv_transfer": {"core"},
    "worker": {"core", "engine", "kv_transfer"},
    "prefill_worker": {"core", "engine", "kv_transfer", "worker"},
    "decode_worker": {"core", "engine", "kv_transfer", "worker"},
    "router": set(),
    "router.routing": {"core"},
    "router.frontdoor": {"core", "proto"},
    "router.cluster": {
        "core", "engine", "worker", "prefill_worker", "decode_worker",
        "router.routing", "router.frontdoor",
    },
    "router.cli": {"core", "engine", "router.routing", "router.frontdoor", "router.cluster"},
    # `baton bench`: the load generator reaches a server through its process and its doors.
    "loadgen": {"core", "engine", "proto", "router.frontdoor"},
    # `baton profile` measures an engine; `baton plan` replays loadgen's workloads through
    # the real router and the prefill gate's order (router.cluster.prefill_gate).
    # It measures the KV transfer between two worker-like processes with kv_transfer.
    "planner": {"core", "engine", "kv_transfer", "loadgen", "router.routing", "router.cluster"},
}  # fmt: skip
"""Package -> the other product packages it may import (docs/architecture.md, "Packages")."""

THIRD_PARTY_ONLY: dict[str, set[str]] = {
    # opentelemetry: the API only at import (core/tracing.py: torch-free, no I/O); the SDK
    # and its exporter load when tracing is on.
    "core": {"xxhash", "msgspec", "opentelemetry"},
    "router.routing": {"xxhash", "msgspec", "redis"},
}
"""Packages held to a short list of outside imports (besides the standard library)."""

NEVER: dict[str, set[str]] = {
    "router.frontdoor": {"torch", "triton", "ray"},
    "engine": {"ray", "fastapi", "uvicorn", "grpc", "redis", "ucxx", "nixl"},
    "kv_transfer": {"ray", "fastapi", "uvicorn", "grpc", "redis"},
    "worker": {"fastapi", "uvicorn", "grpc", "redis"},
}
RAY_MODULES = ("worker.ray_ranks", "router.cluster.")
"""Ray appears only where actors are defined and started."""
MAX_LINES = 400


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "router" and len(parts) > 1 else parts[0]


def test_every_package_is_on_the_map() -> None:
    packages = {package_of(name) for name, _ in product_files()}
    assert packages <= set(MAY_IMPORT), packages - set(MAY_IMPORT)


def test_imports_point_down_the_layers() -> None:
    wrong = [
        f"{module} imports {target} (line {line})"
        for module, edges in module_graph().items()
        for target, line in edges.items()
        if package_of(target) != package_of(module)
        and package_of(target) not in MAY_IMPORT[package_of(module)]
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_circles() -> None:
    assert cycles(module_graph()) == []


def test_outside_imports_stay_where_they_belong() -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    wrong = []
    for name, path in product_files():
        imported = third_party(name, path) - stdlib
        package = package_of(name)
        allowed = THIRD_PARTY_ONLY.get(package)
        if allowed is not None and imported - allowed:
            wrong.append(f"{name} imports {sorted(imported - allowed)}")
        if imported & NEVER.get(package, set()):
            wrong.append(f"{name} imports {sorted(imported & NEVER[package])}")
        if "ray" in imported and not name.startswith(RAY_MODULES):
            wrong.append(f"{name} imports ray")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("top", ["core", "engine", "kv_transfer", "worker", "prefill_worker",
                                 "decode_worker", "router", "proto", "loadgen",
                                 "planner"])  # fmt: skip
def test_no_product_file_over_the_limit(top: str) -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / top).rglob("*.py")
        if not is_generated(path) and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"one concept per file: split these {long}"
