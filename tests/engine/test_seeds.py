"""Seeded sampling by output position: the seed function's golden vector, and a draw that
depends on (seed, position) only, not on the draws before it."""

from __future__ import annotations

import pytest
import torch

from core.sampling import SamplingParams
from engine.sampler import Sampler, SamplingRow, at_position, make_generator
from engine.sampling.seeds import position_seed


def test_position_seed_golden_vector() -> None:
    # (0, 0) is SplitMix64's well-known first output for state 0.
    assert position_seed(0, 0) == 0xE220A8397B1DCDAF
    assert position_seed(0, 1) == 0x6E789E6AA1B965F4
    assert position_seed(1, 0) == 0xBFEF8030DDC2D772
    assert position_seed(1234, 7) == 0xF09719A8635EBF3C
    assert position_seed(-5, 3) == 0xA84EA33220CA5AD5
    assert position_seed(2**64 + 1, 0) == position_seed(1, 0)  # reduced modulo 2**64
    with pytest.raises(ValueError):
        position_seed(0, -1)


def test_positions_and_seeds_give_distinct_streams() -> None:
    seeds = {position_seed(s, p) for s in range(64) for p in range(64)}
    assert len(seeds) == 64 * 64


def test_a_draw_depends_on_seed_and_position_only() -> None:
    """The token at position i is the same from a generator that drew before (the request
    ran here all along) as from a fresh one (the request just moved here)."""
    params = SamplingParams(temperature=1.0, seed=11)
    logits = torch.zeros(1, 500)  # uniform: every draw is pure noise
    sampler = Sampler(500)

    def draw(generator: torch.Generator) -> int:
        return sampler(logits, [SamplingRow(params, [], [], generator)]).token_ids[0]

    used = make_generator(params.seed)
    assert used is not None
    stream = [draw(at_position(used, 11, i)) for i in range(8)]
    fresh = [draw(at_position(torch.Generator(), 11, i)) for i in reversed(range(8))]
    assert fresh[::-1] == stream and len(set(stream)) > 1
    first = make_generator(11)
    assert first is not None and draw(first) == stream[0]
