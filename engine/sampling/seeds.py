"""The seed of a seeded request's draw at one output position: a pure function of
(request seed, position), so the token at position i is the same whether the request ran
on one worker, moved to another mid-stream, was prefilled on one worker and decoded on
another, or ran alone or in any batch.

    position_seed(seed, i) = mix(mix(seed) + (i + 1) * GOLDEN)      (all mod 2**64)

`mix` is SplitMix64's finalizer, so this is output i of a SplitMix64 stream whose start is
itself a hash of the seed: small user seeds (0, 1, 2, ...) do not give shifted copies of
one another's streams. Torch-free; pinned by a golden-vector test.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def position_seed(seed: int, position: int) -> int:
    """A 64-bit generator seed for output position `position` (>= 0) of a request seeded
    with `seed` (any Python int, reduced modulo 2**64)."""
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    return _mix((_mix(int(seed) & _MASK) + (position + 1) * _GOLDEN) & _MASK)
