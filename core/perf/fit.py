"""Fitting the performance model's coefficients to measured samples: non-negative least
squares over the fastest repeat of each shape (on a shared machine the slower repeats
measure the neighbours, not the engine). Pure Python: a handful of unknowns."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from core.perf.model import decode_terms, prefill_terms, transfer_terms


@dataclass(frozen=True)
class Sample:
    shape: tuple[int, ...]
    """prefill: (steps, new tokens, cached tokens); decode: (batch, context); transfer:
    (bytes,)."""
    seconds: float
    """prefill: the prompt's whole prefill; decode: one step; transfer: one send to its
    acknowledgement."""


def fastest(samples: list[Sample]) -> list[Sample]:
    best: dict[tuple[int, ...], float] = {}
    for s in samples:
        best[s.shape] = min(s.seconds, best.get(s.shape, s.seconds))
    return [Sample(shape, t) for shape, t in sorted(best.items())]


def least_squares(rows: list[tuple[float, ...]], ys: list[float]) -> list[float]:
    """Non-negative least squares of ys ~ rows, no intercept: a cost is never negative.

    Clipping the unconstrained solution at 0 is not the constrained optimum (the other
    terms keep the share the clipped one took): the optimum is the unconstrained fit of
    some subset of the terms with the rest at 0, so every subset is tried (a handful of
    unknowns: at most 2^k - 1 small solves)."""
    k = len(rows[0])
    best: tuple[float, list[float]] | None = None
    for mask in range((1 << k) - 1, 0, -1):  # all the terms first: they must separate
        keep = [i for i in range(k) if mask >> i & 1]
        try:
            part = _solve(rows, ys, keep)
        except ValueError:
            if len(keep) == k:
                raise
            continue
        if min(part) < 0:
            continue
        coeffs = [0.0] * k
        for i, c in zip(keep, part, strict=True):
            coeffs[i] = c
        residual = sum((y - sum(c * x for c, x in zip(coeffs, r, strict=True))) ** 2
                       for r, y in zip(rows, ys, strict=True))  # fmt: skip
        if best is None or residual < best[0]:
            best = (residual, coeffs)
    return best[1] if best else [0.0] * k


def _solve(rows: list[tuple[float, ...]], ys: list[float], keep: Iterable[int]) -> list[float]:
    """The unconstrained least-squares coefficients of the terms in `keep`: the normal
    equations by Gauss-Jordan."""
    cols = list(keep)
    k = len(cols)
    a = [[sum(r[i] * r[j] for r in rows) for j in cols] for i in cols]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in cols]
    for col in range(k):
        pivot = max(range(col, k), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) < 1e-12:
            raise ValueError("the samples do not separate the terms: measure more shapes")
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for i in range(k):
            if i != col:
                f = a[i][col] / a[col][col]
                a[i] = [x - f * y for x, y in zip(a[i], a[col], strict=True)]
                b[i] -= f * b[col]
    return [b[i] / a[i][i] for i in range(k)]


def _fit(
    samples: list[Sample], terms: Callable[..., tuple[float, ...]], names: tuple[str, ...]
) -> dict[str, float]:
    """The terms' coefficients in ms (under `names`) and the worst relative error of the fit
    over the fastest sample of each shape."""
    best = fastest(samples)
    rows = [terms(*s.shape) for s in best]
    coeffs = least_squares(rows, [s.seconds for s in best])
    worst = max(
        abs(s.seconds - sum(c * x for c, x in zip(coeffs, row, strict=True))) / s.seconds
        for s, row in zip(best, rows, strict=True)
    )
    return {**{n: 1000 * c for n, c in zip(names, coeffs, strict=True)}, "max_fit_error": worst}


def fit_prefill(samples: list[Sample]) -> dict[str, float]:
    """`step_ms`, `token_ms`, `attn_ms` (per thousand pairs): a profile's prefill keys."""
    return _fit(samples, prefill_terms, ("step_ms", "token_ms", "attn_ms"))


def fit_decode(samples: list[Sample]) -> dict[str, float]:
    """`decode_step_ms`, `decode_row_ms`, `decode_ctx_ms`: a profile's decode keys."""
    return _fit(samples, decode_terms, ("decode_step_ms", "decode_row_ms", "decode_ctx_ms"))


def fit_transfer(samples: list[Sample]) -> dict[str, float]:
    """`transfer_latency_ms` and `transfer_gbps` (1e9 bytes/s) of time = latency + bytes /
    bandwidth: a profile's transfer keys. Least squares of the absolute error, as the other
    fits: the largest sends, which cost the most time, decide the bandwidth; sends small
    enough to stay in the CPU's caches run faster than that line, and the fit errs on the
    pessimistic side for them. Raises ValueError where the time did not grow with the bytes
    (no bandwidth to fit: measure larger transfers)."""
    fit = _fit(samples, transfer_terms, ("transfer_latency_ms", "ms_per_byte"))
    if fit["ms_per_byte"] <= 0:
        raise ValueError(f"transfer time did not grow with the bytes moved (fit: {fit})")
    return {
        "transfer_latency_ms": fit["transfer_latency_ms"],
        "transfer_gbps": 1e-6 / fit["ms_per_byte"],  # bytes per ms / 1e6 = GB/s
        "max_fit_error": fit["max_fit_error"],
    }
