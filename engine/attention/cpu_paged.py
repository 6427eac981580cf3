"""The CPU attention backend: the torch paged path, with decode served by a small C++ kernel
(`cpu_decode.cpp`) that reads K/V straight from the paged cache.

Why our own kernel: on CPU the torch path must gather every sequence's blocks into a padded
copy before attention (reading the cache twice and writing it once per layer per step);
PyTorch has no paged attention for CPU and Triton has no CPU backend. The kernel is built
once per machine with torch's C++ extension builder (cached under TORCH_EXTENSIONS_DIR); if
building fails, the engine falls back to the plain torch backend and says so.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch

from engine.attention.backend import AttentionMetadata, register_backend
from engine.attention.torch_paged import TorchPagedAttention

logger = logging.getLogger(__name__)
_SOURCE = Path(__file__).with_name("cpu_decode.cpp")


def _isa_flags() -> tuple[str, list[str]]:
    """Vector ISA flags this CPU supports (the build is cached per flag set, so a machine
    without AVX2 never loads a build that needs it)."""
    try:
        cpu_flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        cpu_flags = []
    if "avx2" in cpu_flags and "fma" in cpu_flags:
        return "avx2", ["-mavx2", "-mfma"]
    return "generic", []


@functools.cache
def load_kernel() -> Any | None:
    """The compiled extension module, or None if it cannot be built here."""
    try:
        from torch.utils.cpp_extension import load

        isa, isa_flags = _isa_flags()
        # -fopenmp: at::parallel_for is header code that parallelises with OpenMP pragmas;
        # without it the kernel would run on one thread.
        return load(
            name=f"baton_cpu_decode_{isa}",
            sources=[str(_SOURCE)],
            extra_cflags=["-O3", "-fopenmp", "-ffp-contract=fast", *isa_flags],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as e:  # no compiler, no headers: the torch path still works
        logger.warning("CPU decode kernel unavailable (%s); using the torch paged path", e)
        return None


@register_backend
class CPUPagedAttention(TorchPagedAttention):
    name = "cpu"

    def __init__(self) -> None:
        self.kernel = load_kernel()

    def _decode(
        self, q: torch.Tensor, kv_layer: torch.Tensor, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        if self.kernel is None or q.dtype != torch.float32 or not kv_layer.is_contiguous():
            return super()._decode(q, kv_layer, meta, scale)
        out = torch.empty_like(q)
        self.kernel.paged_decode(
            q.contiguous(), kv_layer, meta.decode_block_tables, meta.decode_seq_lens, scale, out
        )
        return out
