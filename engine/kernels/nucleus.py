"""Each row's top-p nucleus threshold, found on the device: no sort, no read on the host.

Over a row of logits x sorted descending, top-p keeps token j iff the probability mass before
it is below p. With g(t) = the mass of the tokens whose logit is above t (non-increasing in
t, dropping only at the row's logits), that is: keep x_j iff g(x_j) < p, i.e. x_j >= t*, where

    t* = the smallest float t with g(t) < p      (always one of the row's logits)

so the nucleus is `x >= t*`. One program per row: a pass for the row's maximum m and softmax
denominator, then a search for t* over float32 values, by the order of their bit patterns
(`_key`): each pass over the row measures g at PIVOTS points of the interval left, and keeps
the part between the last point still at or above p and the first below it, until the
interval is one value wide. The search starts at m - log(V / (1 - p)) (every token below it
holds less than e^-R each, under 1 - p together, so the mass above it is at least p): about
2^23 values to search, 6 passes at 16 pivots. Sums run in one order for every pivot, so g
stays monotone in floating point and the search exact.

vLLM sorts every row (torch.sort: ~1 ms for 64 rows of a 128k vocabulary on a Hopper GPU, its
own figures) or calls FlashInfer's rejection sampler (no per-request seeds there); checking a
nucleus against its best tokens on the host (engine.sampling.filters on the CPU) waits for the
device, which an overlapped step must not do.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.kernels._checks import check, check_tensor

BLOCK = 1024
PIVOTS = 16


@triton.jit
def _key(x):
    """float32 -> int64 with the floats' order (negative floats' magnitude bits flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _value(key):
    """The inverse of `_key`."""
    bits = key.to(tl.int32)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _nucleus_threshold_kernel(
    logits_ptr, top_p_ptr, out_ptr,
    stride, vocab, log_vocab,
    BLOCK: tl.constexpr, PIVOTS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    p = tl.load(top_p_ptr + row)
    cols = tl.arange(0, BLOCK)

    m = tl.full((), -float("inf"), tl.float32)
    z = tl.zeros((), tl.float32)
    for start in range(0, vocab, BLOCK):
        x = tl.load(base + start + cols, mask=start + cols < vocab, other=-float("inf"))
        x = x.to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        z = z * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new

    # g(lo) >= p and g(hi) < p throughout; t* = hi once they are adjacent.
    hi = _key(m)
    lo = _key(m - (log_vocab - tl.log(1.0 - p)))
    steps = (tl.arange(0, PIVOTS) + 1).to(tl.int64)
    while hi - lo > 1:
        pivot_keys = lo + (steps * (hi - lo)) // (PIVOTS + 1)
        pivots = _value(pivot_keys)
        mass = tl.zeros((PIVOTS,), tl.float32)
        for start in range(0, vocab, BLOCK):
            x = tl.load(base + start + cols, mask=start + cols < vocab, other=-float("inf"))
            x = x.to(tl.float32)
            e = tl.exp(x - m)
            above = x[None, :] > pivots[:, None]
            mass += tl.sum(tl.where(above, e[None, :], 0.0), 1)
        at_least_p = mass >= p * z
        lo = tl.max(tl.where(at_least_p, pivot_keys, lo), 0)
        hi = tl.min(tl.where(at_least_p, hi, pivot_keys), 0)
    tl.store(out_ptr + row, _value(hi))


def nucleus_threshold(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [rows, vocab] (float32 or half; a row's largest finite), top_p [rows] float32 in
    (0, 1). Returns each row's t* ([rows], float32): its nucleus is `logits >= t*`."""
    check_tensor("logits", logits, 2, (torch.float32, torch.float16, torch.bfloat16))
    check_tensor("top_p", top_p, 1, (torch.float32,))
    rows, vocab = logits.shape
    check(top_p.shape[0] == rows, f"top_p has {top_p.shape[0]} rows, logits {rows}")
    check(logits.stride(1) == 1, "logits' rows must be contiguous")
    out = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return out
    _nucleus_threshold_kernel[(rows,)](
        logits, top_p.contiguous(), out, logits.stride(0), vocab, math.log(vocab),
        BLOCK=BLOCK, PIVOTS=PIVOTS,
    )  # fmt: skip
    return out
