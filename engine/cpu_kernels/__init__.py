"""C++ kernels for the CPU path, built once per machine with torch's extension builder.

Why our own: PyTorch has no paged attention for CPU and runs each elementwise op of the
SiLU-gate and the RMSNorm as its own pass over memory; Triton has no CPU backend. Each
kernel file is one extension module, compiled with the vector ISA this CPU supports and
cached under TORCH_EXTENSIONS_DIR under a name that includes a hash of its sources (so an
edited kernel is rebuilt, not a stale build loaded). If building fails, `load` returns None
and callers keep the plain torch path.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
_DIR = Path(__file__).parent
_HEADERS = ("vec_math.h",)


def _isa_flags() -> tuple[str, list[str]]:
    """Vector ISA flags this CPU supports (part of the build's name, so a machine without
    AVX2 never loads a build that needs it)."""
    try:
        cpu_flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        cpu_flags = []
    if "avx2" in cpu_flags and "fma" in cpu_flags:
        return "avx2", ["-mavx2", "-mfma"]
    return "generic", []


@functools.cache
def load(name: str) -> Any | None:
    """The compiled module of `<name>.cpp`, or None if it cannot be built here."""
    try:
        from torch.utils.cpp_extension import load as build

        source = _DIR / f"{name}.cpp"
        digest = hashlib.sha256(source.read_bytes())
        for header in _HEADERS:
            digest.update((_DIR / header).read_bytes())
        isa, isa_flags = _isa_flags()
        # -fopenmp: at::parallel_for is header code that parallelises with OpenMP pragmas;
        # without it the kernels would run on one thread.
        return build(
            name=f"baton_{name}_{isa}_{digest.hexdigest()[:10]}",
            sources=[str(source)],
            extra_cflags=["-O3", "-fopenmp", "-ffp-contract=fast", *isa_flags],
            extra_ldflags=["-fopenmp"],
            extra_include_paths=[str(_DIR)],
            verbose=False,
        )
    except Exception as e:  # no compiler, no headers: the torch path still works
        logger.warning("CPU kernel %s unavailable (%s); using the torch path", name, e)
        return None


def load_all() -> bool:
    """Build every kernel now (the install step calls this so a server starts fast)."""
    return all(load(n) is not None for n in ("paged_decode", "fused"))
