"""Linear layers on CPU: our skinny GEMM for decode-sized batches, MKL for the rest.

Why: at decode sizes (a few rows per step) the weights stream from DRAM once per step and
the GEMM is as much memory- as compute-bound. PyTorch's default CPU linear (MKL sgemm)
streams them at ~5 GB/s at 16 rows here; oneDNN with weights reordered into its blocked
layout at ~8 GB/s; `engine/cpu_kernels/skinny_gemm.cpp`, on the checkpoint's own [N, K]
layout, takes 20-45% less time than oneDNN at 1-16 rows and is still ahead at 64 (weights
streamed, the 125M preset's shapes). Above
`skinny_max_rows()` (prefill chunks) MKL, oneDNN-prepacked and oneDNN-plain measured within
a few percent of each other at 768 rows, so MKL runs them and no second, repacked copy of
the weights is kept. BATON_CPU_GEMM=0 keeps the plain torch path everywhere.

Where the kernel stops paying depends on the vector width MKL gets. With AVX-512 it was
ahead up to 64 rows. On an AVX2-only CPU (an AMD EPYC, the 125M preset's layer shapes, 12
layers' weights streamed, 2 threads) it took 36/66/134/208/280 ms against MKL's
64/101/172/227/278 ms at 32/64/128/192/256 rows and fell behind at 512 (578 vs 481): so up to
192 rows there, which covers mid-sized decode batches and prompt chunks.

bfloat16 (on CPUs with AVX-512 BF16): a few rows our engine/cpu_kernels/bf16_gemv.cpp (to 40
where `vdpbf16ps` is fast and there is no AMX, as on an AMD EPYC Zen 5); on
CPUs with AMX, `BF16_AMX_MIN_ROWS` to `BF16_AMX_MAX_ROWS` rows our
engine/cpu_kernels/bf16_amx.cpp (the weight as AMX's A operand, read in place); the rest
torch's bf16 linear (oneDNN, AMX where the CPU has it, reordering the weights per call).
Without AMX, where a probe at start finds `vdpbf16ps` slow against float32 FMAs (0.47-0.51 of
their FLOPs on a Xeon whose hypervisor hides AMX), every row count past bf16_gemv's goes to
engine/cpu_kernels/bf16_fma.cpp (bf16 weights widened to float32 in registers): the 125M
preset's MLP shapes there, GFLOPS ours / oneDNN's, one thread 90 / 65 at 64 rows, 91 / 70 at
336, 87-97 / 73-74 at 2,048; two threads 188 / 139, 178 / 144, 174-197 / 144-148. The
125M preset's linear layers on an AMX Xeon, 2 threads, ms (one run; this machine's runs move
~15% between minutes, so the crossings are approximate):

| rows | 1 | 2 | 4 | 8 | 16 | 32 | 64 | 128 | 192 | 256 |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| oneDNN | 10.3 | 11.0 | 11.1 | 11.2 | 11.0 | 11.4 | 16.1 | 19.4 | 22.3 | 23.7 |
| bf16_gemv | 3.6 | 4.0 | 5.6 | | | | | | | |
| bf16_amx | 4.5 | 4.5 | 5.1 | 5.2 | 4.7 | 6.6 | 9.6 | 14.2 | 20.2 | 25.4 |

Since the C tiles are transposed in registers the kernel stays ahead further: 22.4 / 25.9 /
26.7 / 31.1 ms against oneDNN's 24.8 / 26.6 / 26.8 / 30.3 at 256 / 288 / 320 / 352 rows (12
layers' weights cold, two runs alike). Since it takes x in panels that stay in L2 it is
ahead in the engine to 1,280 rows: one prompt's prefill step, best of 4 alternating runs,
AMX / oneDNN 0.90 / 0.92 / 0.87 / 0.91 / 0.91 at 384 / 512 / 768 / 1,024 / 1,280 tokens,
1.11 at 1,536 and at 2,048 (oneDNN's blocking wins there, its per-call reorder paid off).
And its work is shared from a queue, where oneDNN splits it in equal halves: served at
saturation (256 -> 64 at 12 req/s, most steps a 256-token prompt beside ~40 decode rows, so
just over 288 rows) 8.53 / 8.39 req/s with the AMX kernel to 640 rows against 7.84 / 7.95
with oneDNN above 288 (alternating runs), and offline on the same arrivals 11.38 / 11.33
against 10.81 / 10.53. The same rows take the MLP's gate-up projection with SiLU-and-mul in
the kernel's epilogue (`silu_mul_linear`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core import env
from engine import cpu_kernels

SKINNY_MAX_ROWS_AVX512 = 64
SKINNY_MAX_ROWS_AVX2 = 192
BF16_MAX_ROWS = 7
"""bf16_gemv up to here where the AMX kernel cannot take the shape (or the CPU has no AMX)."""
BF16_MAX_ROWS_FAST_DOT = 40
"""bf16_gemv up to here on a CPU without AMX whose `vdpbf16ps` is fast (see
`bf16_gemv_max_rows`)."""
BF16_AMX_MIN_ROWS = 3
BF16_AMX_MAX_ROWS = 1280
DPBF16_OVER_FMA_FOR_FMA = 0.65
"""bf16_fma takes bf16 linears (past bf16_gemv's rows, any number) where `vdpbf16ps` gives
less than this share of the float32 FMAs' FLOPs."""


@functools.cache
def skinny_max_rows() -> int:
    """The most rows the skinny kernel takes on this CPU (more go to MKL)."""
    wide = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    return SKINNY_MAX_ROWS_AVX512 if wide else SKINNY_MAX_ROWS_AVX2


def _kernel() -> Any | None:
    return cpu_kernels.load_available("skinny_gemm")


def _bf16_kernel() -> Any | None:
    return cpu_kernels.load_available("bf16_gemv")


def _amx_kernel() -> Any | None:
    return cpu_kernels.load_available("bf16_amx")


@functools.cache
def _fma_kernel() -> Any | None:
    """bf16_fma on a CPU without AMX whose float32 FMAs outrun its `vdpbf16ps` (or that has
    no AVX-512 BF16 at all), else None. Ours ran 90-97 GFLOPS a core against oneDNN's 70-74
    where `vdpbf16ps` gave 0.51 of the FMAs' FLOPs, so oneDNN, whose speed follows that
    instruction's, would draw level near 0.65."""
    if not env.BF16_FMA.get() or _amx_kernel() is not None:
        return None
    fma = cpu_kernels.load_available("bf16_fma")
    ratio = cpu_kernels.dpbf16_over_fma()
    return fma if ratio is None or ratio < DPBF16_OVER_FMA_FOR_FMA else None


@functools.cache
def bf16_gemv_max_rows() -> int:
    """The most rows bf16_gemv takes where AMX does not: `BF16_MAX_ROWS_FAST_DOT` where
    `vdpbf16ps` gives at least `DPBF16_OVER_FMA_FOR_FMA` of the FMAs' FLOPs, else
    `BF16_MAX_ROWS`. On an AMD EPYC (Zen 5, 1.85; 2 threads) the 125M preset's 12 layers took
    ms, bf16_gemv / oneDNN: 3.9 / 7.2 at 8 rows, 5.4 / 8.4 at 16, 7.1 / 9.6 at 24, 9.3 / 11.0
    at 32, 11.4 / 12.4 at 40, 13.3 / 13.3 at 48, 17.3 / 15.8 at 64 (the LM head level at 48
    too); a 6 x 4 register tile over panels of x, as bf16_fma's, on `vdpbf16ps` was behind
    bf16_gemv throughout and behind oneDNN past 32, so it was not kept."""
    ratio = cpu_kernels.dpbf16_over_fma()
    if _amx_kernel() is not None or ratio is None or ratio < DPBF16_OVER_FMA_FOR_FMA:
        return BF16_MAX_ROWS
    return BF16_MAX_ROWS_FAST_DOT


def _tiled(weight: torch.Tensor) -> Any | None:
    """The AMX kernel where this CPU has it and it can tile `weight` [N, K], else None."""
    amx = _amx_kernel()
    n, k = weight.shape
    return amx if amx is not None and n % 32 == 0 and k % 32 == 0 else None


Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
"""(x [rows, K] contiguous, weight [N, K], bias [N] or None) -> [rows, N]."""


def kernel_for(rows: int, weight: torch.Tensor) -> Kernel | None:
    """Our kernel for a 2-D `x` of `rows` rows (contiguous, `weight`'s dtype) times `weight`,
    or None where torch's linear is faster or ours cannot take the shape. `linear` asks this
    per call; engine/cpu_forward.py asks once a step."""
    if weight.dtype == torch.bfloat16:
        amx, gemv = _tiled(weight), _bf16_kernel()
        few = rows < (BF16_AMX_MIN_ROWS if amx is not None else bf16_gemv_max_rows() + 1)
        if few and gemv is not None:
            return gemv.bf16_linear
        if amx is not None:
            return amx.bf16_amx_linear if not few and rows <= BF16_AMX_MAX_ROWS else None
        fma = _fma_kernel()
        return fma.bf16_fma_linear if fma is not None and weight.shape[1] % 32 == 0 else None
    skinny = _kernel()
    if skinny is None or weight.dtype != torch.float32:
        return None
    return None if rows > skinny_max_rows() or weight.shape[1] % 8 else skinny.skinny_linear


def silu_mul_kernel_for(
    rows: int, weight: torch.Tensor
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """`silu_mul_linear`'s fused kernel (x [rows, K] contiguous, [gate | up] weight) -> [rows,
    I], or None where the shape or batch goes the unfused way."""
    amx = _tiled(weight) if weight.dtype == torch.bfloat16 else None
    if amx is None or not BF16_AMX_MIN_ROWS <= rows <= BF16_AMX_MAX_ROWS:
        return None
    return amx.bf16_amx_silu_mul_linear


def silu_mul_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """silu(x @ gate^T) * (x @ up^T) for `weight` = [gate | up] in one AMX pass (the [rows, 2I]
    product never written, the SiLU-and-mul op not run), or None where the shape or batch goes
    the unfused way (the rows `kernel_for` gives the AMX kernel); the values are the unfused
    path's, bit for bit."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    kernel = silu_mul_kernel_for(rows, weight) if x.dtype == weight.dtype else None
    if kernel is None:
        return None
    y = kernel(x.reshape(rows, x.shape[-1]).contiguous(), weight)
    return y.view(*x.shape[:-1], weight.shape[0] // 2)


def enabled(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or not env.CPU_GEMM.get():
        return False
    if dtype == torch.bfloat16:
        return _bf16_kernel() is not None or _fma_kernel() is not None
    return dtype == torch.float32 and _kernel() is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias for a float32 or bfloat16 CPU `x` of any leading shape."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    kernel = kernel_for(rows, weight) if rows and x.dtype == weight.dtype else None
    if kernel is None:
        return F.linear(x, weight, bias)
    y = kernel(x.reshape(rows, x.shape[-1]).contiguous(), weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


def enable(model: nn.Module) -> int:
    """Route every layer with a `use_cpu_gemm` flag through `linear`; returns how many."""
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "use_cpu_gemm") and weight is not None and weight.is_floating_point():
            if not module.weight.is_contiguous():
                module.weight.data = module.weight.data.contiguous()
            module.use_cpu_gemm = True
            count += 1
    return count
