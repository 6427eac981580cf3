"""The sampler on CUDA reads nothing of the device's on the host (but for penalties, whose rows
wait for their tokens anyway): a kernel finds a top-p-only row's nucleus (`nucleus_on_device`,
engine/kernels/nucleus.py) instead of a check on the host whether its best 1024 tokens hold
it. The same nuclei, the same seeded tokens alone or in any batch; checked on the CPU (the
kernel under Triton's interpreter) with `HostReads`."""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from core.sampling import SamplingParams
from engine.sampler import Sampler, SamplingRow, make_generator
from engine.sampling.bias import row_bias
from engine.sampling.filters import TOP_P_CANDIDATES, filter_logits
from tests.engine.test_sampler import crowded, random_logits, reference_kept, run_seeded
from tests.support.host_reads import HostReads

VOCAB = 3 * TOP_P_CANDIDATES

# Every kind of row an overlapped step samples (no penalties, no grammar: those rows make
# the engine wait for their tokens first).
MIXED = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, logprobs=2),
    SamplingParams(temperature=1.0, top_p=0.9),  # flat row below: nucleus past the candidates
    SamplingParams(temperature=0.7, top_p=0.5),
    SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=20),
    SamplingParams(temperature=1.0, min_p=0.05, logprobs=3),
    SamplingParams(temperature=0.9, top_p=0.95, seed=11),
    SamplingParams(temperature=1.0, seed=12, logit_bias={3: 2.0}),
    SamplingParams(temperature=1.0),
]


def mixed_batch() -> tuple[torch.Tensor, list[SamplingRow]]:
    logits = random_logits(len(MIXED), VOCAB, seed=5, scale=4.0)
    logits[2] = random_logits(1, VOCAB, seed=6, scale=0.3)[0]
    rows = [
        SamplingRow(
            p,
            [1, 2],
            [3],
            make_generator(p.seed),
            row_bias(p.logit_bias, frozenset()),
        )
        for p in MIXED
    ]
    return logits, rows


def test_a_step_s_sampling_reads_nothing_on_the_host_with_nuclei_on_device() -> None:
    logits, rows = mixed_batch()
    with HostReads() as reads:
        sampled = Sampler(VOCAB, seed=3, nucleus_on_device=True).sample(logits, rows)
    assert reads.places == []
    out = sampled.result()
    assert len(out.token_ids) == len(MIXED) and all(0 <= t < VOCAB for t in out.token_ids)
    assert out.token_ids[0] == int(logits[0].argmax())
    assert [lp is not None for lp in out.logprobs] == [p.logprobs is not None for p in MIXED]


def test_checking_a_nucleus_against_its_candidates_reads_the_host() -> None:
    """What the kernel avoids, and what shows `HostReads` sees a read where there is one."""
    logits, rows = mixed_batch()
    with HostReads() as reads:
        Sampler(VOCAB, seed=3, nucleus_on_device=False).sample(logits, rows)
    assert any("nonzero" in place and "filters.py" in place for place in reads.places)


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p", "scale"),
    [
        (0, 0.9, 0.0, 6.0),  # peaked: nucleus within the best 1024 tokens
        (0, 0.9, 0.0, 0.5),  # flat: wider
        (0, 0.95, 0.05, 4.0),
        (200, 0.8, 0.0, 1.0),
    ],
)
def test_nuclei_on_device_match_brute_force(top_k, top_p, min_p, scale) -> None:
    logits = random_logits(3, VOCAB, seed=top_k + int(100 * top_p), scale=scale)
    filtered = filter_logits(
        logits.clone(), [top_k] * 3, [top_p] * 3, [min_p] * 3, nucleus_on_device=True
    )
    masked = filtered.to_dense(3, VOCAB)
    kept = [set(torch.nonzero(r > -math.inf).flatten().tolist()) for r in masked]
    assert kept == reference_kept(logits, top_k, top_p, min_p)
    survivors = masked > -math.inf
    assert torch.equal(masked[survivors], logits[survivors]), "kept logits must be unchanged"


def test_a_batch_s_rows_keep_their_own_forms_and_nuclei() -> None:
    logits = random_logits(5, VOCAB, seed=9, scale=2.0)
    top_k, top_p, min_p = [0, 40, 0, 0, 7], [0.9, 0.9, 1.0, 0.6, 1.0], [0.0, 0.0, 0.0, 0.1, 0.0]
    filtered = filter_logits(logits.clone(), top_k, top_p, min_p, nucleus_on_device=True)
    assert filtered.candidate_rows == [1, 4] and filtered.full_rows == [2, 0, 3]
    masked = filtered.to_dense(5, VOCAB)
    for i in range(5):
        kept = set(torch.nonzero(masked[i] > -math.inf).flatten().tolist())
        assert [kept] == reference_kept(logits[i : i + 1], top_k[i], top_p[i], min_p[i])


def test_a_seeded_request_samples_alike_alone_or_in_any_batch_on_device(monkeypatch) -> None:
    monkeypatch.setattr(
        "tests.engine.test_sampler.Sampler",
        lambda vocab, seed=None: Sampler(vocab, seed, nucleus_on_device=True),
    )
    reference = run_seeded(lambda step, vocab: ([], 0))
    assert run_seeded(crowded) == reference
    assert len(set(reference)) > 1
