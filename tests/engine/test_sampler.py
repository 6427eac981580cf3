"""Sampler tests: every knob against a hand-computed or brute-force reference."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from core.sampling import SamplingParams
from engine.sampler import Sampler, SamplingRow, greedy_tokens, make_generator
from engine.sampling.filters import TOP_P_CANDIDATES, filter_logits
from engine.sampling.penalties import apply_penalties

NUM_DRAWS = 4000


def row(params: SamplingParams, prompt=(), output=(), generator=None) -> SamplingRow:
    return SamplingRow(params, list(prompt), list(output), generator)


def random_logits(num_rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, vocab, generator=gen) * scale


def empirical(sampler: Sampler, logits_row: list[float], params: SamplingParams) -> Counter:
    """Token frequencies of NUM_DRAWS independent draws (one batch of identical rows)."""
    logits = torch.tensor([logits_row] * NUM_DRAWS)
    out = sampler(logits, [row(params)] * NUM_DRAWS)
    return Counter(out.token_ids)


# Four tokens with probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
PROBS = [0.5, 0.3, 0.15, 0.05]
LOGITS = [math.log(p) for p in PROBS]


# ---------------------------------------------------------------- input checks


def test_invalid_inputs_raise_clear_errors() -> None:
    sampler = Sampler(vocab_size=8)
    greedy = row(SamplingParams(temperature=0.0))
    with pytest.raises(ValueError, match="2-D"):
        sampler(torch.zeros(8), [greedy])
    with pytest.raises(ValueError, match="2 rows but 1"):
        sampler(torch.zeros(2, 8), [greedy])
    with pytest.raises(ValueError, match="fewer than vocab_size=8"):
        sampler(torch.zeros(1, 7), [greedy])
    with pytest.raises(ValueError, match="floating-point"):
        sampler(torch.zeros(1, 8, dtype=torch.int64), [greedy])
    with pytest.raises(TypeError):
        sampler([[0.0] * 8], [greedy])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vocab_size"):
        Sampler(vocab_size=0)
    penalised = row(SamplingParams(repetition_penalty=1.2), prompt=[1, 9])
    with pytest.raises(ValueError, match="prompt token id 9"):
        sampler(torch.zeros(1, 8), [penalised])


def test_empty_batch() -> None:
    out = Sampler(vocab_size=4)(torch.zeros(0, 4), [])
    assert out.token_ids == [] and out.logprobs == []


def test_padded_vocab_columns_are_never_sampled() -> None:
    sampler = Sampler(vocab_size=4, seed=0)
    logits = torch.tensor([[*LOGITS, 100.0, 100.0]] * 3)
    rows = [
        row(SamplingParams(temperature=0.0)),
        row(SamplingParams(temperature=1.0)),
        row(SamplingParams(temperature=0.0, logprobs=2)),
    ]
    out = sampler(logits, rows)
    assert all(t < 4 for t in out.token_ids)
    assert sampler(logits[:1], rows[:1]).token_ids == [0]
    top = out.logprobs[2].top
    assert [t for t, _ in top] == [0, 1]
    assert top[0][1] == pytest.approx(math.log(0.5), abs=1e-5)  # normalised over 4 tokens only


# ---------------------------------------------------------------- greedy


def test_greedy_fast_path_equals_general_path() -> None:
    sampler = Sampler(vocab_size=1000, seed=0)
    logits = random_logits(16, 1000, seed=1)
    rows = [row(SamplingParams(temperature=0.0), prompt=[1, 2], output=[3]) for _ in range(16)]
    fast = sampler(logits, rows)
    general = sampler._sample_general(logits, rows).result()
    assert fast.token_ids == general.token_ids == logits.argmax(dim=-1).tolist()
    assert fast.logprobs == [None] * 16


def test_greedy_uses_penalised_logits() -> None:
    sampler = Sampler(vocab_size=4)
    logits = torch.tensor([[2.0, 1.9, -1.0, -3.0]])
    plain = row(SamplingParams(temperature=0.0), output=[0])
    assert sampler(logits, [plain]).token_ids == [0]
    # 2.0 / 1.1 = 1.82 < 1.9
    penalised = row(SamplingParams(temperature=0.0, repetition_penalty=1.1), output=[0])
    assert sampler(logits, [penalised]).token_ids == [1]
    # 2.0 - 0.2 (presence) < 1.9
    present = row(SamplingParams(temperature=0.0, presence_penalty=0.2), output=[0])
    assert sampler(logits, [present]).token_ids == [1]
    assert torch.equal(logits, torch.tensor([[2.0, 1.9, -1.0, -3.0]])), "input was modified"


# ---------------------------------------------------------------- penalties


def reference_penalties(logits, prompts, outputs, rep, freq, pres):
    out = [list(r) for r in logits.tolist()]
    for i, values in enumerate(out):
        seen = set(prompts[i]) | set(outputs[i])
        counts = Counter(outputs[i])
        for t in range(len(values)):
            if t in seen:
                values[t] = values[t] / rep[i] if values[t] > 0 else values[t] * rep[i]
            values[t] -= freq[i] * counts[t] + pres[i] * (counts[t] > 0)
    return torch.tensor(out)


def test_penalties_match_reference_math() -> None:
    logits = random_logits(4, 12, seed=2)
    prompts = [[0, 1, 1, 5], [2], [], [11, 3]]
    outputs = [[1, 1, 1, 7], [2, 2, 9], [4], []]
    rep = [1.3, 1.0, 0.8, 2.0]
    freq = [0.5, -0.4, 0.0, 1.0]
    pres = [0.25, 0.0, -1.5, 2.0]
    expected = reference_penalties(logits, prompts, outputs, rep, freq, pres)
    actual = logits.clone()
    apply_penalties(actual, prompts, outputs, rep, freq, pres)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6)


def test_penalties_accept_tensors_and_tuples() -> None:
    logits = random_logits(2, 6, seed=3)
    expected = logits.clone()
    apply_penalties(expected, [[1, 2], [3]], [[2], [4, 4]], [1.5, 1.5], [0.3, 0.3], [0.1, 0.1])
    actual = logits.clone()
    apply_penalties(
        actual,
        [torch.tensor([1, 2]), (3,)],
        [(2,), torch.tensor([4, 4])],
        [1.5, 1.5],
        [0.3, 0.3],
        [0.1, 0.1],
    )
    torch.testing.assert_close(actual, expected)


# ---------------------------------------------------------------- temperature and filters


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature_matches_scaled_softmax(temperature: float) -> None:
    counts = empirical(Sampler(4, seed=1), LOGITS, SamplingParams(temperature=temperature))
    expected = torch.tensor(LOGITS).div(temperature).softmax(-1).tolist()
    for token, p in enumerate(expected):
        assert counts[token] / NUM_DRAWS == pytest.approx(p, abs=0.03)


@pytest.mark.parametrize(
    ("params", "support", "renormalised"),
    [
        (SamplingParams(top_k=1), {0}, None),
        (SamplingParams(top_k=2), {0, 1}, [0.625, 0.375]),
        (SamplingParams(top_k=-1), {0, 1, 2, 3}, PROBS),
        (SamplingParams(top_p=0.75), {0, 1}, [0.625, 0.375]),
        (SamplingParams(top_p=0.85), {0, 1, 2}, None),
        (SamplingParams(top_p=0.01), {0}, None),
        (SamplingParams(min_p=0.2), {0, 1, 2}, None),  # drops p < 0.1
        (SamplingParams(min_p=0.35), {0, 1}, None),  # drops p < 0.175
        (SamplingParams(top_k=3, top_p=0.6), {0, 1}, None),  # 0.5/0.95 < 0.6 <= 0.8/0.95
        (SamplingParams(top_k=3, min_p=0.5), {0, 1}, None),
    ],
)
def test_filters_support_and_distribution(params, support, renormalised) -> None:
    counts = empirical(Sampler(4, seed=2), LOGITS, params)
    assert set(counts) == support
    if renormalised:
        for token, p in enumerate(renormalised):
            assert counts[token] / NUM_DRAWS == pytest.approx(p, abs=0.03)


def reference_kept(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> list[set[int]]:
    """Brute force in float64: sort each row, apply the definitions literally."""
    kept = []
    for values in logits.double().tolist():
        order = sorted(range(len(values)), key=lambda t: -values[t])
        if 0 < top_k < len(values):
            order = order[:top_k]
        z = sum(math.exp(values[t] - values[order[0]]) for t in order)
        probs = [math.exp(values[t] - values[order[0]]) / z for t in order]
        keep, mass = [], 0.0
        for t, p in zip(order, probs):
            if mass >= top_p:
                break
            keep.append(t)
            mass += p
        keep = [t for t, p in zip(keep, probs) if p >= min_p * probs[0]]
        kept.append(set(keep))
    return kept


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p", "scale"),
    [
        (50, 1.0, 0.0, 3.0),
        (0, 0.9, 0.0, 6.0),  # peaked: nucleus inside the candidates
        (0, 0.9, 0.0, 0.5),  # flat: nucleus wider than the candidates -> full sort
        (200, 0.8, 0.0, 1.0),
        (0, 0.95, 0.05, 4.0),
        (1500, 0.99, 0.0, 0.3),
    ],
)
def test_filter_masks_match_brute_force(top_k, top_p, min_p, scale) -> None:
    vocab = 3 * TOP_P_CANDIDATES
    logits = random_logits(3, vocab, seed=top_k + int(100 * top_p), scale=scale)
    filtered = filter_logits(logits.clone(), [top_k] * 3, [top_p] * 3, [min_p] * 3)
    masked = filtered.to_dense(3, vocab)
    kept = [set(torch.nonzero(r > -math.inf).flatten().tolist()) for r in masked]
    assert kept == reference_kept(logits, top_k, top_p, min_p)
    survivors = masked > -math.inf
    assert torch.equal(masked[survivors], logits[survivors]), "kept logits must be unchanged"


def test_filters_leave_unfiltered_rows_alone() -> None:
    logits = random_logits(3, 100, seed=4)
    filtered = filter_logits(logits.clone(), [0, 5, 0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    assert filtered.full_rows == [0, 2] and filtered.candidate_rows == [1]
    masked = filtered.to_dense(3, 100)
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    assert int((masked[1] > -math.inf).sum()) == 5


def test_seeded_rows_sample_the_right_distribution() -> None:
    sampler = Sampler(4)
    logits = torch.tensor([LOGITS] * NUM_DRAWS)
    for params, expected in [
        (SamplingParams(top_k=2, seed=1), [0.625, 0.375, 0.0, 0.0]),
        (SamplingParams(temperature=1.0, seed=1), PROBS),
    ]:
        rows = [row(params, generator=make_generator(i)) for i in range(NUM_DRAWS)]
        counts = Counter(sampler(logits, rows).token_ids)
        for token, p in enumerate(expected):
            assert counts[token] / NUM_DRAWS == pytest.approx(p, abs=0.03)


# ---------------------------------------------------------------- seeds


SEEDED = SamplingParams(
    temperature=0.8, top_k=40, top_p=0.9, seed=7, repetition_penalty=1.1, frequency_penalty=0.2
)


def run_seeded(batch_builder, steps: int = 6) -> list[int]:
    """Decode `steps` tokens for the seeded request, placed in a batch built per step."""
    vocab = 2 * TOP_P_CANDIDATES
    sampler = Sampler(vocab, seed=None)  # unseeded rows get fresh randomness every run
    generator = make_generator(SEEDED.seed)
    output: list[int] = []
    for step in range(steps):
        target = random_logits(1, vocab, seed=100 + step, scale=2.0)
        others, position = batch_builder(step, vocab)
        logits = torch.cat(
            [o[0] for o in others[:position]] + [target] + [o[0] for o in others[position:]]
        )
        rows = [o[1] for o in others]
        rows.insert(position, row(SEEDED, prompt=[1, 2, 3], output=output, generator=generator))
        token = sampler(logits, rows).token_ids[position]
        output.append(token)
    return output


def alone(step: int, vocab: int):
    return [], 0


def crowded(step: int, vocab: int):
    other_params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_p=0.5),  # top-p only: wider candidate set
        SamplingParams(temperature=1.3, top_k=TOP_P_CANDIDATES + 7, seed=99),
        SamplingParams(temperature=0.7, min_p=0.1, logprobs=3),
        SamplingParams(temperature=1.0, presence_penalty=1.0),
    ]
    others = []
    for i, params in enumerate(other_params[: 2 + step % 4]):
        gen = make_generator(params.seed)
        logits = random_logits(1, vocab, seed=1000 * step + i, scale=float(i + 1))
        others.append((logits, row(params, prompt=[5], output=[i, i], generator=gen)))
    return others, step % (len(others) + 1)


def test_seeded_request_same_tokens_alone_or_in_any_batch() -> None:
    reference = run_seeded(alone)
    assert run_seeded(alone) == reference
    assert run_seeded(crowded) == reference
    assert len(set(reference)) > 1


def test_different_seeds_differ_and_unseeded_sampler_seed_is_reproducible() -> None:
    logits = torch.zeros(64, 500)  # uniform: every draw is pure noise
    params = SamplingParams(temperature=1.0)
    a = Sampler(500, seed=3)(logits, [row(params)] * 64).token_ids
    b = Sampler(500, seed=3)(logits, [row(params)] * 64).token_ids
    c = Sampler(500, seed=4)(logits, [row(params)] * 64).token_ids
    assert a == b and a != c
    g1, g2 = make_generator(1), make_generator(2)
    s = Sampler(500)
    assert s(logits[:1], [row(params, generator=g1)]) != s(logits[:1], [row(params, generator=g2)])
    assert make_generator(None) is None
    assert make_generator(-5) is not None  # any int is a valid seed


# ---------------------------------------------------------------- logprobs


def test_logprobs_come_from_raw_logits() -> None:
    sampler = Sampler(vocab_size=6, seed=0)
    logits = random_logits(3, 6, seed=5)
    raw = torch.log_softmax(logits, dim=-1)
    rows = [
        row(SamplingParams(temperature=0.5, logprobs=0, repetition_penalty=2.0), output=[0, 1]),
        row(SamplingParams(temperature=0.0, logprobs=3, presence_penalty=2.0), output=[2]),
        row(SamplingParams(temperature=1.0)),
    ]
    out = sampler(logits, rows)
    first, second, third = out.logprobs
    assert third is None
    assert first.token_id == out.token_ids[0] and first.top == ()
    assert first.logprob == pytest.approx(raw[0, out.token_ids[0]].item(), abs=1e-6)
    assert second.logprob == pytest.approx(raw[1, out.token_ids[1]].item(), abs=1e-6)
    values, ids = raw[1].topk(3)
    assert [t for t, _ in second.top] == ids.tolist()
    assert [lp for _, lp in second.top] == pytest.approx(values.tolist(), abs=1e-6)


def test_a_bf16_model_s_logits_sample_as_their_float32_widening() -> None:
    """The runner hands the LM head's logits over in the model's dtype: plain greedy rows
    take their argmax as they are, every other path widens them first (exactly), so tokens
    and log-probs are those of the float32 copy, with the same seeds."""
    logits = random_logits(4, 50, seed=9).bfloat16()
    wide = logits.float()
    greedy = [row(SamplingParams(temperature=0.0)) for _ in range(4)]
    assert Sampler(50, seed=0)(logits, greedy).token_ids == wide.argmax(-1).tolist()
    mixed = [
        row(SamplingParams(temperature=0.0, logprobs=2)),
        row(SamplingParams(temperature=0.7, top_k=5, logprobs=0, seed=3)),
        row(SamplingParams(temperature=1.0, repetition_penalty=1.5), output=[1, 2]),
        row(SamplingParams(temperature=0.0)),
    ]
    got, want = Sampler(50, seed=0)(logits, mixed), Sampler(50, seed=0)(wide, mixed)
    assert got.token_ids == want.token_ids
    assert got.logprobs == want.logprobs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_tokens_are_argmaxs_including_ties_and_nan(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(11)
    logits = torch.randint(0, 3, (33, 5000), generator=gen).to(dtype)  # ties in every row
    logits[4, 17] = float("nan")
    logits[9] = 2
    assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1))
    assert greedy_tokens(logits)[9] == 0 and greedy_tokens(logits)[4] == 17
