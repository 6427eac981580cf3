"""Loading the CPU kernels never waits on a build lock a dead process left behind."""

from __future__ import annotations

import os
import time

import pytest

from engine import cpu_kernels

pytestmark = pytest.mark.skipif(
    cpu_kernels.load("fused") is None, reason="no C++ toolchain for the kernels"
)


def _build_dir(name: str):
    module = cpu_kernels.load(name)
    return cpu_kernels._build_root() / module.__name__


def test_a_built_kernel_loads_despite_a_lock_left_by_a_killed_worker() -> None:
    lock = _build_dir("fused") / "lock"
    lock.touch()  # as if a worker died inside torch's builder
    try:
        start = time.monotonic()
        module = cpu_kernels.load.__wrapped__("fused")  # bypass the per-process cache
        assert module is not None and hasattr(module, "silu_and_mul")
        assert time.monotonic() - start < 30
    finally:
        lock.unlink(missing_ok=True)


def test_only_an_old_lock_is_removed(tmp_path) -> None:
    lock = tmp_path / "lock"
    lock.touch()
    cpu_kernels._clear_stale_lock(tmp_path)
    assert lock.exists()  # a build may be running right now
    old = time.time() - 2 * cpu_kernels._STALE_LOCK_S
    os.utime(lock, (old, old))
    cpu_kernels._clear_stale_lock(tmp_path)
    assert not lock.exists()


def test_a_broken_build_file_is_rebuilt_not_fatal(tmp_path) -> None:
    (tmp_path / "baton_x.so").write_bytes(b"not a shared object")
    assert cpu_kernels._import_built("baton_x", tmp_path) is None
    assert cpu_kernels._import_built("baton_missing", tmp_path) is None


def test_another_torch_or_python_gets_a_build_of_its_own(monkeypatch) -> None:
    """A build links against one torch and one Python: loaded into another it crashes (a
    build from torch 2.13 segfaulted in torch 2.11's first fused RMSNorm), so each gets its
    own name, and with it its own folder."""
    import sys

    import torch

    name = cpu_kernels.build_name("fused")
    assert name is not None and name == cpu_kernels.build_name("fused")
    monkeypatch.setattr(torch, "__version__", f"{torch.__version__}.other")
    other_torch = cpu_kernels.build_name("fused")
    major, minor = sys.version_info[:2]
    monkeypatch.setattr(sys, "version_info", (major, minor + 1, 0, "final", 0))
    other_python = cpu_kernels.build_name("fused")
    assert len({name[0], other_torch[0], other_python[0]}) == 3
    assert name[1] == other_torch[1] == other_python[1]  # the same ISA flags
