"""logit_bias and the min_tokens ban in the sampler: added to a private copy (the caller's
logits untouched, logprobs the model's own), greedy and random rows alike, a ban beating
any bias, ids past the vocabulary skipped; and the SamplingParams checks."""

from __future__ import annotations

import pytest
import torch

from core.sampling import SamplingParams
from engine.sampler import Sampler, SamplingRow
from engine.sampling.bias import row_bias

VOCAB = 8


def rows(params: SamplingParams, biases: list) -> list[SamplingRow]:
    return [SamplingRow(params, [1], [], None, b) for b in biases]


def test_bias_moves_greedy_and_random_rows_and_leaves_logits_alone() -> None:
    logits = torch.zeros(3, VOCAB)
    logits[:, 0] = 5.0
    before = logits.clone()
    sampler = Sampler(VOCAB, seed=0)
    biases = [row_bias([(3, 100.0)], ()), None, row_bias([], [0])]
    greedy = sampler(logits, rows(SamplingParams(temperature=0.0), biases))
    assert greedy.token_ids[:2] == [3, 0] and greedy.token_ids[2] != 0
    random = sampler(logits, rows(SamplingParams(temperature=1.0, logprobs=0), biases))
    assert random.token_ids[0] == 3 and random.token_ids[2] != 0
    assert torch.equal(logits, before)
    lp = random.logprobs[0]
    assert lp is not None and lp.logprob == pytest.approx(torch.log_softmax(before[0], 0)[3])


def test_a_ban_beats_any_bias_and_ids_past_the_vocabulary_are_skipped() -> None:
    assert row_bias([(2, 100.0)], [2]) == {2: float("-inf")}
    assert row_bias([], ()) is None
    logits = torch.zeros(1, VOCAB + 4)  # a padded LM head
    out = Sampler(VOCAB)(logits, rows(SamplingParams(temperature=0.0), [{VOCAB + 1: 100.0}]))
    assert out.token_ids[0] < VOCAB


@pytest.mark.parametrize(
    "kwargs",
    [{"logit_bias": {1: 101.0}}, {"logit_bias": {-1: 1.0}}, {"min_tokens": 17},
     {"min_tokens": -1}],
)  # fmt: skip
def test_params_checks(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(max_tokens=16, **kwargs)


def test_logit_bias_is_stored_as_sorted_pairs() -> None:
    params = SamplingParams(logit_bias={5: 1.0, 2: -3})
    assert params.logit_bias == ((2, -3.0), (5, 1.0))
    hash(params)
