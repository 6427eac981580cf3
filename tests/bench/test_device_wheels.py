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
