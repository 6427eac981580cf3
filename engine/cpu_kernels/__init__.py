"""C++ kernels for the CPU path, built once per machine with torch's extension builder.

Why our own: PyTorch has no paged attention for CPU and runs each elementwise op of the
SiLU-gate and the RMSNorm as its own pass over memory; Triton has no CPU backend. (The shm
KV transfer's block copy lives here too: the same build and cache.) Each kernel file is one
extension module, compiled with the vector ISA this CPU supports and cached under
TORCH_EXTENSIONS_DIR under a name that hashes its sources, flags, torch and Python
(`build_name`: an edited kernel or an upgraded torch gets a new build, never a stale one
loaded). If building fails, `load` returns None and callers keep the plain torch path.

A process loads an already built module straight from its file, without torch's build lock:
a worker killed while holding that lock (a scale-down, a crash during start-up) would
otherwise leave a lock file that every later process waits on forever. Only a missing or
unloadable build goes through the builder, and a lock older than any build is removed first.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
_DIR = Path(__file__).parent
_HEADERS = (
    "vec_math.h",
    "f32_lanes.h",
    "paged_decode.h",
    "row_tiles.h",
    "amx.h",
    "work_queue.h",
    "no_gil.h",
)
_KERNELS = (
    "paged_decode",
    "kv_int8",
    "fused",
    "skinny_gemm",
    "int8_gemm",
    "copy_blocks",
    "int8_vnni",
    "bf16_gemv",
    "bf16_amx",
    "bf16_fma",
    "paged_decode_amx",
    "shared_attention_amx",
    "shared_attention_dot",
    "thread_team",
)
_SOURCES = {"shared_attention_amx": "shared_attention", "shared_attention_dot": "shared_attention"}
"""Kernels built from another kernel's source for another ISA (the source picks its path by
the build's flags); the rest are `<name>.cpp`."""
_NEEDS = {
    "int8_vnni": ("avx512vnni", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")),
    "bf16_gemv": ("avx512bf16", ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")),
    "bf16_fma": ("avx512", ("avx512f", "avx512bw", "avx512vl")),
    "bf16_amx": (
        "amxbf16",
        ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"),
    ),
    "paged_decode_amx": (
        "amxbf16",
        ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"),
    ),
    "shared_attention_amx": (
        "amxbf16",
        ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"),
    ),
    "shared_attention_dot": ("avx512bf16", ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")),
}
"""Kernels written for one vector ISA only: its name and the /proc/cpuinfo flags it needs
(the others are built for the best of AVX2 or plain C++ this CPU has)."""
_PREFERS = {
    "int8_gemm": ("avx512", ("avx512f", "avx512bw", "avx512vl")),
    "paged_decode": ("avx512", ("avx512f", "avx512bw", "avx512vl")),
    "fused": ("avx512bf16", ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")),
}
"""Kernels with a path for a wider ISA, built for it where the CPU has it (else as above)."""
_CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=fast", "-fno-trapping-math")
"""-fopenmp: at::parallel_for is header code that parallelises with OpenMP pragmas; without it
the kernels would run on one thread. -fno-trapping-math: without it gcc vectorises no loop
that rounds (floorf in vexp: every softmax and SiLU ran scalar), since a vector round may
raise an inexact flag the scalar one would not; nothing here reads the floating-point flags,
and no result changes (no reassociation)."""
_STALE_LOCK_S = 600.0
"""A build takes 1-2 minutes here; a lock this old belongs to a process that died."""


def _build_root() -> Path:
    default = Path.home() / ".cache" / "torch_extensions"
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR", default)) / "baton"


def _import_built(name: str, build_dir: Path) -> Any | None:
    path = build_dir / f"{name}.so"
    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception as e:  # a half-written file from an interrupted build: rebuild it
        logger.warning("CPU kernel %s at %s does not load (%s); rebuilding", name, path, e)
        return None


def _clear_stale_lock(build_dir: Path) -> None:
    lock = build_dir / "lock"
    try:
        if time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink()
            logger.warning("removed a stale build lock %s", lock)
    except FileNotFoundError:
        pass


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's flags as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        return frozenset(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return frozenset()


def _isa_flags(name: str) -> tuple[str, list[str]] | None:
    """Vector ISA flags for kernel `name` on this CPU (part of the build's name, so a
    machine without AVX2 never loads a build that needs it); None when the kernel needs an
    ISA this CPU lacks."""
    flags = cpu_flags()
    isa, wanted = _NEEDS.get(name) or _PREFERS.get(name) or ("", ())
    if wanted and all(flag in flags for flag in wanted):
        return isa, [*(_compiler_flag(flag) for flag in wanted), "-mavx2", "-mfma"]
    if name in _NEEDS:
        return None
    if "avx2" in flags and "fma" in flags:
        return "avx2", ["-mavx2", "-mfma"]
    return "generic", []


def _compiler_flag(cpu_flag: str) -> str:
    """/proc/cpuinfo's name -> gcc's: avx512_vnni -> -mavx512vnni, but amx_tile -> -mamx-tile."""
    if cpu_flag.startswith("amx_"):
        return f"-m{cpu_flag.replace('_', '-')}"
    return f"-m{cpu_flag.replace('_', '')}"


def _source(name: str) -> Path:
    return _DIR / f"{_SOURCES.get(name, name)}.cpp"


def build_name(name: str) -> tuple[str, list[str]] | None:
    """Kernel `name`'s build (its folder and module name) and the ISA flags it is compiled
    with; None when it needs an ISA this CPU lacks. The name changes with the sources, the
    flags, torch and Python: a build links against one torch and one Python, and loaded
    into another (an upgraded torch, a second interpreter sharing the cache) it crashes
    rather than fails."""
    import torch

    digest = hashlib.sha256(_source(name).read_bytes())
    for header in _HEADERS:
        digest.update((_DIR / header).read_bytes())
    isa_and_flags = _isa_flags(name)
    if isa_and_flags is None:
        return None
    isa, isa_flags = isa_and_flags
    digest.update(" ".join([*_CFLAGS, *isa_flags]).encode())
    digest.update(f"torch {torch.__version__} python {sys.version_info[:2]}".encode())
    return f"baton_{name}_{isa}_{digest.hexdigest()[:10]}", isa_flags


@functools.cache
def load(name: str) -> Any | None:
    """The compiled module of kernel `name` (`<name>.cpp` unless `_SOURCES` names another),
    or None if it cannot be built here."""
    try:
        import torch  # noqa: F401  (the module links against libtorch: load it first)
        from torch.utils.cpp_extension import load as build

        built = build_name(name)
        if built is None:
            logger.info("CPU kernel %s needs %s, which this CPU lacks", name, _NEEDS[name][0])
            return None
        full_name, isa_flags = built
        build_dir = _build_root() / full_name
        module = _import_built(full_name, build_dir)
        if module is not None:
            return module
        build_dir.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(build_dir)
        return build(
            name=full_name,
            sources=[str(_source(name))],
            extra_cflags=[*_CFLAGS, *isa_flags],
            extra_ldflags=["-fopenmp"],
            extra_include_paths=[str(_DIR)],
            build_directory=str(build_dir),
            verbose=False,
        )
    except Exception as e:  # no compiler, no headers: the torch path still works
        logger.warning("CPU kernel %s unavailable (%s); using the torch path", name, e)
        return None


@functools.cache
def load_available(name: str) -> Any | None:
    """`load(name)` for a kernel whose module says whether it was built with its ISA path
    (`available`): None where it cannot be built here or was built without it."""
    module = load(name)
    return module if module is not None and module.available else None


@functools.cache
def dpbf16_over_fma() -> float | None:
    """How many float32 FLOPs a second this CPU's `vdpbf16ps` gives against its float32 FMAs
    (bf16_fma.cpp's probe, run once a process: 0.47-0.51 on a Xeon whose hypervisor hides
    AMX, 1.85 on an AMD EPYC Zen 5), or None where the CPU lacks AVX-512 BF16 or the probe
    cannot be built. It picks the kernels for bfloat16 products without AMX."""
    module = load_available("bf16_fma")
    if module is None or "avx512_bf16" not in cpu_flags():
        return None
    ratio = float(module.dpbf16_over_fma())
    logger.info("vdpbf16ps gives %.2f of float32 FMAs' FLOPs on this CPU", ratio)
    return ratio


def load_all() -> bool:
    """Build every kernel this CPU can run now (the install step calls this so a server
    starts fast)."""
    return all(load(name) is not None for name in _KERNELS if _isa_flags(name) is not None)
