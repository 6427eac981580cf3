"""Resolving "auto" device, dtype and attention backend; host values onto the device."""

from __future__ import annotations

import functools

import numpy
import torch

from core import env

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def check_cache_dtype(kv_cache_dtype: str, device: torch.device) -> None:
    """An fp8 (e4m3) cache on CUDA needs compute capability 8.9 or newer (Ada, Hopper): below
    it Triton has no e4m3 type, and the first kernel would fail far from the setting."""
    if kv_cache_dtype != "fp8" or device.type != "cuda":
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise ValueError(
            f"kv_cache_dtype fp8 needs a GPU of compute capability 8.9 or newer; "
            f"{torch.cuda.get_device_name(device)} is {major}.{minor} (use int8)"
        )


def resolve_dtype(name: str, checkpoint_dtype: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        # CPUs here lack fast half-precision GEMMs; float32 is both faster and exact.
        name = "float32" if device.type == "cpu" else checkpoint_dtype
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def resolve_attention_backend(name: str, device: torch.device) -> str:
    forced = env.ATTENTION.get()
    if forced:
        return forced
    if name == "auto":
        # Triton kernels on CUDA; on CPU they would only run in the (slow) interpreter, so
        # the plain-torch paged path serves there.
        if device.type == "cuda":
            return "triton" if has_triton() else "torch"
        return "cpu" if _cpu_kernel_available() else "torch"
    return name


def _cpu_kernel_available() -> bool:
    from engine.attention.cpu_paged import load_kernel

    return load_kernel() is not None


@functools.cache
def has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


_FUSED_DTYPES = (torch.float32, torch.bfloat16)


def cpu_fused_ops(x: torch.Tensor):  # -> the compiled module or None
    """The fused CPU elementwise kernels (engine/cpu_kernels/fused.cpp) for a contiguous
    float32 or bfloat16 2-D CPU tensor; None otherwise, or with BATON_CPU_FUSED=0 (the plain
    torch ops, e.g. to bisect a mismatch).

    On by default: in disaggregated serving, two runs each way, alternating, gave the decode
    worker a TPOT p50 / p99 of 47-57 / 78-80 ms with them and 52-59 / 98-107 ms without."""
    if x.is_cuda or x.dtype not in _FUSED_DTYPES or x.dim() != 2 or not x.is_contiguous():
        return None
    if not env.CPU_FUSED.get():
        return None
    from engine import cpu_kernels

    return cpu_kernels.load("fused")


def use_fused_kernels(x: torch.Tensor) -> bool:
    """Layers run their Triton kernel (norm, rotary) on CUDA tensors when triton is there;
    BATON_FUSED_KERNELS=0 keeps the plain-torch ops (e.g. to bisect a GPU mismatch)."""
    return x.is_cuda and has_triton() and env.FUSED_KERNELS.get()


_NUMPY_DTYPES = {torch.int64: numpy.int64, torch.int32: numpy.int32, torch.float32: numpy.float32}


def host_to_device(values: object, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype, device=device)`, without waiting for the device.

    A CUDA tensor made from host data is copied synchronously: the host first waits for
    everything queued on the stream, so a step laid out while the one before still runs
    (engine/overlap.py) would wait for it. This stages the values in pinned memory (torch's
    caching host allocator keeps the buffer until the copy is done) and queues the copy."""
    numpy_dtype = _NUMPY_DTYPES.get(dtype)
    if numpy_dtype is None:
        tensor = torch.tensor(values, dtype=dtype)
    else:  # through numpy: torch.tensor inspects each element (64 ints: 4.9 µs against 1.6)
        tensor = torch.from_numpy(numpy.asarray(values, dtype=numpy_dtype))
    device = torch.device(device)
    if device.type != "cuda":
        return tensor if device.type == "cpu" else tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
