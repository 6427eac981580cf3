"""INT8 quantization of the linear layers: weight-only (`--quantization int8`), or weights and
activations (`--quantization w8a8`).

Each linear layer's weight W [N, K] becomes int8 `wq` with one float32 scale per output
channel, symmetric: scale[n] = max_k |W[n, k]| / 127, wq = round(W / scale). Activations stay
in the model's dtype; the GEMM reads a quarter of fp32's weight bytes (half of bf16's), which
at decode sizes is most of a step's time. The checkpoint is quantized on load, after the
weight loaders have put each TP rank's shard in place, so each rank quantizes its own shard
(a row-parallel shard's scales are over its slice of K: the same per-channel scheme).

The LM head is quantized too (at batch 1 it is a fifth of the 125M preset's weight bytes;
with it, the trained checkpoint's perplexity stayed within 0.01% of float32's,
docs/performance.md); a tied head gets its own int8 copy, so the embedding keeps its float
rows. What stays in
full precision: the embedding (a lookup reads one row per token) and the norms.

W8A8 keeps those weights and also quantizes each GEMM's input, per row (token), symmetric and
on the fly: sx[m] = max_k |x[m, k]| / 127, xq = round(x / sx). The products are int8 x int8
summed exactly in int32, on the CPU's int8 units (AMX tiles, AVX-512 VNNI) through oneDNN
(`torch._int_mm`), so a GEMM costs about what its weight bytes take to read at one row and a
fraction of float32's compute from a few rows up; y = acc * sx[m] * scale[n] (+ bias).
Why oneDNN and not a kernel of ours: it already picks AMX or VNNI per CPU, with blocking we
would have to rewrite for each; our part is the per-row quantization around it. Up to
`VNNI_MAX_ROWS` rows (decode) our own AVX-512 VNNI kernel takes over
(engine/cpu_kernels/int8_vnni.cpp: oneDNN's setup and the torch ops around it cost more than
the products there); it needs each weight row's sum (`finish`), and gives the same bits.
The int32 sums are exact and each row has its own scale, so a row's output does not depend
on the rows batched with it. CPU only (on a GPU, `int8`'s Triton kernel): refused on CUDA.

Kernels: on CPU float32 engine/cpu_kernels/int8_gemm.cpp for up to `CPU_KERNEL_MAX_ROWS`
rows (the 125M preset's layers, 2 threads, AVX2: 4.1 / 8.4 / 18 / 70 / 142 / 245 ms against
float32's 13 / 16 / 26 / 75 / 143 / 239 ms at 1 / 4 / 16 / 64 / 128 / 192 rows); above it the
weight is widened to float32 for one MKL GEMM (prefill chunks: the widening is small beside
M x N x K, and MKL's blocking wins from ~300 rows). On CUDA the Triton kernel in
engine/kernels/int8_linear.py.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine import cpu_kernels

logger = logging.getLogger(__name__)

METHODS = ("int8", "w8a8")
INT8_UNITS = frozenset({"avx512_vnni", "amx_int8"})
"""CPU flags of int8 dot-product units W8A8 is for; without one, torch's int8 GEMM falls
back to plain integer loops (SmolLM2-135M on an AVX2 EPYC: decode 0.22x, prefill 0.03x of
float32's; docs/performance.md)."""
CPU_KERNEL_MAX_ROWS = 256
VNNI_MAX_ROWS = 16
"""W8A8 GEMMs of up to this many rows take the VNNI kernel (the 125M preset's layers, 2
threads: 2.3 / 2.7 / 4.6 / 8.0 ms at 1 / 4 / 8 / 16 rows, against oneDNN's 8.2 / 9.4 / 9.8
/ 11.0; level at 24)."""


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(wq int8 [N, K], scale float32 [N]) with W ~= wq * scale[:, None]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    wq = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return wq.contiguous(), scale.contiguous()


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(xq int8 [M, K], sx float32 [M, 1]) with x ~= xq * sx, per row, symmetric."""
    x = x.float()
    sx = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127.0)
    return torch.round(x / sx).clamp_(-127, 127).to(torch.int8), sx


def quantizable(model: nn.Module, method: str) -> list[nn.Module]:
    """The layers `method` turns into int8: every one with an empty `weight_scale` slot,
    each marked with the method's activations (W8A8: quantized too; refused on CUDA)."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization {method!r}; choose from {', '.join(METHODS)}")
    layers = [
        m
        for m in model.modules()
        if "weight_scale" in getattr(m, "_buffers", {}) and m.weight_scale is None
    ]
    for module in layers:
        if method == "w8a8" and module.weight.is_cuda:
            raise ValueError("w8a8 runs on CPU only (oneDNN int8 GEMMs); on GPUs use int8")
        module.int8_activations = method == "w8a8"
    if method == "w8a8" and layers and not INT8_UNITS & cpu_kernels.cpu_flags():
        logger.warning(
            "w8a8 on a CPU without AVX-512 VNNI or AMX: its int8 GEMMs run many times slower "
            "than float32 here; --quantization int8 (float32 activations) is the one for it"
        )
    return layers


def quantize_model(model: nn.Module, method: str) -> int:
    """Quantizes every layer that has a `weight_scale` slot; returns how many."""
    layers = quantizable(model, method)
    for module in layers:
        wq, scale = quantize_weight(module.weight)
        module.weight = nn.Parameter(wq, requires_grad=False)
        module.weight_scale = scale
    return len(layers)


def finish(model: nn.Module) -> int:
    """Once the weights are final: each W8A8 layer's weight row sums, which the VNNI kernel
    needs (it multiplies x + 128, unsigned, by the weights); returns how many layers."""
    count = 0
    for module in model.modules():
        if getattr(module, "int8_activations", False):
            module.weight_sum = module.weight.sum(dim=1, dtype=torch.int32)
            count += 1
    return count


def _cpu_kernel() -> Any | None:
    return cpu_kernels.load_available("int8_gemm")


def _vnni_kernel() -> Any | None:
    return cpu_kernels.load_available("int8_vnni")


def int8_linear(
    x: torch.Tensor,
    wq: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    int8_activations: bool = False,
    weight_sum: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ (wq * scale[:, None]).T + bias for `x` of any leading shape; with
    `int8_activations`, x's rows quantized first (W8A8, the module docstring), on the VNNI
    kernel when `weight_sum` (`finish`) is given and the rows are few."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    x2 = x.reshape(rows, k)
    if int8_activations and rows:
        if (
            weight_sum is not None
            and rows <= VNNI_MAX_ROWS
            and x.dtype == torch.float32
            and _vnni_kernel() is not None
        ):
            y = _vnni_kernel().w8a8_linear(x2.contiguous(), wq, weight_sum, scale)
        else:
            xq, sx = quantize_activations(x2)
            y = torch._int_mm(xq, wq.t()).to(torch.float32).mul_(sx).mul_(scale)
        if bias is not None:
            y.add_(bias)
        y = y.to(x.dtype)
    elif x.is_cuda:
        from engine.kernels.int8_linear import int8_linear as triton_int8_linear

        y = triton_int8_linear(x2.contiguous(), wq, scale, bias)
    elif (
        x.dtype == torch.float32
        and rows <= CPU_KERNEL_MAX_ROWS
        and k % 8 == 0
        and _cpu_kernel() is not None
    ):
        y = _cpu_kernel().int8_linear(x2.contiguous(), wq, scale, bias)
    else:
        w = (wq.to(torch.float32) * scale[:, None]).to(x.dtype)
        y = F.linear(x2, w, bias)
    return y.view(*x.shape[:-1], wq.shape[0])
