"""SiLU-and-multiply over a fused [gate | up] projection in one pass:

    out = silu(gate) * up        gate, up = gate_up[:, :I], gate_up[:, I:]

in torch's order for a half-precision activation (what Hugging Face's MLP runs): silu in
float32, rounded to the activation dtype, then the product in float32, rounded again. Torch
runs it as two kernels (silu into a temporary, then the multiply), reading and writing the
intermediate activation three times where this reads it once and writes the result once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels._checks import FLOAT_DTYPES, check, check_tensor

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr, out_ptr,
    stride_in, stride_out,
    INTERMEDIATE: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTERMEDIATE
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + INTERMEDIATE + cols, mask=mask, other=0.0)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (silu * up.to(tl.float32)).to(dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [N, 2 * I]. Returns [N, I]."""
    check_tensor("gate_up", gate_up, 2, FLOAT_DTYPES)
    rows, width = gate_up.shape
    check(width % 2 == 0, f"gate_up's last dimension must be even, got {width}")
    intermediate = width // 2
    out = torch.empty(rows, intermediate, dtype=gate_up.dtype, device=gate_up.device)
    if rows == 0 or intermediate == 0:
        return out
    grid = (rows, triton.cdiv(intermediate, BLOCK))
    _silu_and_mul_kernel[grid](
        gate_up, out, gate_up.stride(0), out.stride(0), INTERMEDIATE=intermediate, BLOCK=BLOCK
    )
    return out


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
