"""bench/device/wheels.py: Ray's wheel travels without its Java jar, its libraries and the
dashboard's web client, its RECORD naming only what is left, every file's mode kept (its
binaries stay executable)."""

from __future__ import annotations

import zipfile

from bench.device.wheels import pinned, slim_ray


def test_ray_travels_without_what_a_python_cluster_never_reads(tmp_path) -> None:
    wheel = tmp_path / "ray-1.0-cp312-cp312-manylinux2014_x86_64.whl"
    files = {
        "ray/__init__.py": b"",
        "ray/core/src/ray/raylet/raylet": b"\x7fELF",
        "ray/jars/ray_dist.jar": b"jar" * 100,
        "ray/dashboard/client/build/static/js/main.js": b"x",
        "ray/dashboard/modules/job/job_agent.py": b"",
        "ray/rllib/__init__.py": b"",
        "ray/data/__init__.py": b"",
        "ray/_private/ray_constants.py": b"",
    }
    record = "".join(f"{name},sha256=x,1\n" for name in files) + "ray-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100755 if name.endswith("raylet") else 0o100644) << 16
            z.writestr(info, data)
        z.writestr("ray-1.0.dist-info/RECORD", record)

    slim_ray(wheel)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        kept_record = z.read("ray-1.0.dist-info/RECORD").decode()
        mode = z.getinfo("ray/core/src/ray/raylet/raylet").external_attr >> 16
    assert names == {
        "ray/__init__.py",
        "ray/core/src/ray/raylet/raylet",
        "ray/dashboard/modules/job/job_agent.py",
        "ray/_private/ray_constants.py",
        "ray-1.0.dist-info/RECORD",
    }
    for gone in ("jars", "client", "rllib", "ray/data/"):
        assert gone not in kept_record, gone
    assert "ray/dashboard/modules/job/job_agent.py," in kept_record
    assert mode == 0o100755


def test_versions_are_the_ones_tested_here() -> None:
    import torch

    assert pinned(["torch", "no-such-package-here"]) == [
        f"torch=={torch.__version__}",
        "no-such-package-here",
    ]


def test_every_package_the_device_check_imports_is_on_the_host_or_travels() -> None:
    """Each third-party import in what the device check runs (the product, the benches and
    load generator, `tests/gpu` and its support) is the host's, a wheel that travels, or one
    imported only where present (the host has no msgpack, prometheus-client or pytest, and
    xxhash only through torch-geometric)."""
    import sys
    from importlib import metadata

    from bench.device.wheels import ENGINE, HOST, OPTIONAL, SERVE
    from tests.architecture.imports import ROOT, imported_names

    gpu_suite_reads = ("gpu", "support", "conftest.py", "oracle.py")
    ours = {p.name for p in ROOT.iterdir() if p.is_dir()}
    dists = metadata.packages_distributions()
    known = HOST | OPTIONAL | set(ENGINE) | set(SERVE)
    missing: dict[str, str] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if any(part.startswith(".") for part in rel.parts):  # a local venv, the wheels
            continue
        if rel.parts[0] == "tests" and rel.parts[1] not in gpu_suite_reads:
            continue
        for dotted, _ in imported_names(".".join(rel.with_suffix("").parts), path):
            top = dotted.split(".")[0]
            if top in sys.stdlib_module_names or top in ours:
                continue
            names = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
            if not names & known:
                missing[top] = str(rel)
    assert not missing, missing


def test_what_the_travelling_wheels_require_is_there_too() -> None:
    """Each wheel's own requirements (on Python 3.12, no extras) are the host's or travel:
    Ray needs msgpack, which no package of the host's brings."""
    from importlib import metadata

    from packaging.requirements import Requirement

    from bench.device.wheels import ENGINE, HOST, SERVE

    known = HOST | set(ENGINE) | set(SERVE)
    host_312 = {"python_version": "3.12", "python_full_version": "3.12.3", "extra": ""}
    missing = []
    for dist in [*ENGINE, *SERVE]:
        if dist == "importlib-metadata":  # not installed here: the standard library's
            continue
        for line in metadata.requires(dist) or []:
            req = Requirement(line)
            name = req.name.lower().replace("_", "-")
            if req.marker is not None and not req.marker.evaluate(host_312):
                continue
            if name not in known:
                missing.append(f"{dist} -> {name}")
    assert not missing, missing


def test_the_rehearsal_installs_the_hosts_packages_and_none_that_travel() -> None:
    from bench.device.rehearsal import host_requirements
    from bench.device.wheels import ENGINE, SERVE

    wanted = host_requirements()
    assert "torch==2.11.0" in wanted and "transformers==5.17.0" in wanted
    names = {r.split("==")[0] for r in wanted}
    # Only the two the host has as well travel (at the versions tested here, first on the path).
    assert names & {*ENGINE, *SERVE} == {"pydantic", "protobuf"}
    assert not names & {"msgpack", "prometheus-client", "pytest", "matplotlib"}
