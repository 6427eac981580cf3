"""Speculative decoding by prompt lookup (engine/spec): the proposer, the back-off, and the
engine's output with it on: greedy equal to transformers, sampled (seeded) equal to the
engine without speculation token for token, whatever the sampling parameters."""

from __future__ import annotations

import pytest

from core.sampling import SamplingParams
from engine.llm import LLM
from engine.spec import Speculator, propose_ngram
from engine.spec.speculator import MAX_BACKOFF_STEPS, SpecStats
from tests import oracle


def test_the_latest_occurrence_of_the_longest_suffix_wins() -> None:
    tokens = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 2, 3]
    assert propose_ngram(tokens, 2, max_n=2) == [7, 8]  # "2 3" last seen before 7 8
    assert propose_ngram([4, 1, 2, 3, 5, 6, 0, 2, 3], 3, max_n=3) == [5, 6, 0]
    assert propose_ngram([1, 2, 3, 4], 3) == []  # nothing recurs
    assert propose_ngram([5, 6, 5], 4, max_n=1) == [6, 5]  # cut at the end of the context
    assert propose_ngram([5, 6, 5], 0) == []


def test_a_full_continuation_beats_a_later_short_one() -> None:
    # "2 3" last occurs just before the end (two tokens follow it there before the present),
    # and earlier with three after it: the earlier one is proposed.
    tokens = [2, 3, 7, 8, 9, 1, 2, 3, 2, 3]
    assert propose_ngram(tokens, 3, max_n=2) == [7, 8, 9]
    assert propose_ngram(tokens, 2, max_n=2) == [2, 3]  # two asked: the latest has them
    assert propose_ngram([9, 2, 3, 2, 3], 3, max_n=2) == [2, 3]  # the most there is


def test_a_request_that_keeps_missing_backs_off() -> None:
    stats = SpecStats()
    skips = []
    for _ in range(7):
        Speculator._record(stats, drafted=4, accepted=0, max_length=8)
        skips.append(stats.skip)
    assert skips == [1, 2, 4, 8, 16, 16, 16] and MAX_BACKOFF_STEPS == 16
    Speculator._record(stats, drafted=4, accepted=2, max_length=8)
    assert stats.backoff == 1 and (stats.drafted, stats.accepted) == (32, 2)


def test_the_draft_length_follows_what_was_accepted() -> None:
    stats = SpecStats()
    Speculator._record(stats, drafted=4, accepted=4, max_length=8)
    assert stats.length == 8  # all accepted: longer runs next
    Speculator._record(stats, drafted=8, accepted=8, max_length=8)
    assert stats.length == 8  # capped
    Speculator._record(stats, drafted=8, accepted=2, max_length=8)
    assert stats.length == 3  # one past what held


def _prompts() -> list[list[int]]:
    # Repetitive prompts (lookups find something) and one with nothing to look up.
    return [[7, 8, 9, 10, 11] * 8, [3, 4] * 30 + [5], list(range(40, 90)), [21, 22, 23] * 5]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_output_equals_transformers_with_drafts_accepted(tiny_model_dir, arch) -> None:
    model_dir = tiny_model_dir(arch)
    llm = LLM(model_dir, speculative="ngram", num_speculative_tokens=3, num_kv_blocks=128)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs = llm.generate(_prompts(), params)
    for prompt, out in zip(_prompts(), outs, strict=True):
        assert list(out.token_ids) == oracle.hf_greedy(str(model_dir), tuple(prompt), 24)
    totals = llm.engine.step_totals
    assert totals.draft_tokens > 0 and totals.accepted_tokens > 0
    # Each request's own counts (the front door's per-request histogram) add up to them.
    assert sum(o.num_draft_tokens for o in outs) == totals.draft_tokens
    assert sum(o.num_accepted_tokens for o in outs) == totals.accepted_tokens


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=20, temperature=1.0, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=0.8, top_k=5, seed=3, repetition_penalty=1.3,
                       frequency_penalty=0.5, min_tokens=12, logprobs=2),
        SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(9, 4), ignore_eos=True),
    ],
    ids=["seeded", "penalties-min-tokens-logprobs", "greedy-stop-tokens"],
)  # fmt: skip
def test_speculation_changes_no_token(tiny_model_dir, monkeypatch, params: SamplingParams) -> None:
    """A seeded draw depends only on (seed, position), so speculation must not change a
    single token, nor a logprob, nor where a stop token ends the request. The drafts here
    are the true continuation with every third token wrong, so that each step accepts some
    and rejects one, whatever these sampling parameters make of the model."""
    model_dir = tiny_model_dir("llama")
    prompts = _prompts()
    plain = LLM(model_dir, num_kv_blocks=128).generate(prompts, params)
    truths = [list(p) + list(out.token_ids) for p, out in zip(prompts, plain, strict=True)]

    def half_right(tokens, num_tokens, **_):
        truth = next(t for t in truths if list(tokens) == t[: len(tokens)])
        drafts = truth[len(tokens) : len(tokens) + num_tokens]
        return [t + 1 if (len(tokens) + i) % 3 == 0 else t for i, t in enumerate(drafts)]

    monkeypatch.setattr("engine.spec.speculator.propose_ngram", half_right)
    spec = LLM(model_dir, speculative="ngram", num_speculative_tokens=4, num_kv_blocks=128)
    for a, b in zip(plain, spec.generate(prompts, params), strict=True):
        assert list(b.token_ids) == list(a.token_ids)
        assert b.finish_reason == a.finish_reason
        if params.logprobs:
            assert [lp.token_id for lp in b.logprobs] == [lp.token_id for lp in a.logprobs]
            for x, y in zip(a.logprobs, b.logprobs, strict=True):
                assert y.logprob == pytest.approx(x.logprob, abs=1e-4)
    totals = spec.engine.step_totals
    assert 0 < totals.accepted_tokens < totals.draft_tokens


def test_blocks_are_cached_by_real_tokens_only(tiny_model_dir) -> None:
    """Rejected drafts filled KV slots; a later request with the real continuation must
    hit only blocks whose tokens are real and still get transformers' output."""
    model_dir = tiny_model_dir("llama")
    llm = LLM(model_dir, speculative="ngram", num_kv_blocks=128)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompt = [7, 8, 9, 10, 11] * 8
    first = llm.generate([prompt], params)[0]
    follow = prompt + list(first.token_ids)[:30]
    again = llm.generate([follow], SamplingParams(max_tokens=8, temperature=0.0))[0]
    assert again.num_cached_tokens > 0
    assert list(again.token_ids) == oracle.hf_greedy(str(model_dir), tuple(follow), 8)


def test_bad_speculative_settings_are_refused() -> None:
    from core.config import EngineConfig

    with pytest.raises(ValueError, match="speculative"):
        EngineConfig(speculative="eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(speculative="ngram", num_speculative_tokens=0)
