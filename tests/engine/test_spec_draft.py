"""Speculative decoding with a draft model (engine/spec/draft_model.py): a second, smaller
checkpoint drafts greedily and the target verifies; the output never changes."""

from __future__ import annotations

import pytest

from core.config import EngineConfig
from core.sampling import SamplingParams
from engine.llm import LLM
from tests import oracle

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _prompts() -> list[list[int]]:
    return [[7, 8, 9, 10, 11] * 8, list(range(40, 90)), [21, 22, 23] * 5, [5, 900, 17]]


def _draft(tiny_model_dir, **options):
    """A draft that is not the target: fewer layers, other weights, the same vocabulary."""
    return tiny_model_dir("llama", num_hidden_layers=2, seed=5, **options)


def test_the_target_as_its_own_draft_has_every_greedy_draft_accepted(tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    llm = LLM(model_dir, speculative="draft", speculative_model=str(model_dir),
              num_speculative_tokens=3, num_kv_blocks=128)  # fmt: skip
    outs = llm.generate(_prompts(), GREEDY)
    for prompt, out in zip(_prompts(), outs, strict=True):
        assert list(out.token_ids) == oracle.hf_greedy(str(model_dir), tuple(prompt), 24)
    totals = llm.engine.step_totals
    assert totals.draft_tokens > 0 and totals.accepted_tokens == totals.draft_tokens
    # Where the target runs as a flat loop of kernels (engine/cpu_forward.py), so does the
    # draft, and its drafts still agree.
    draft = llm.engine.scheduler.speculator.draft_model
    assert (draft.cpu_forward is None) == (llm.engine.runner.cpu_forward is None)
    assert draft.cpu_forward is None or draft.cpu_forward.steps > 0
    # Each step verifies more than one token: fewer decode steps than tokens.
    assert sum(o.num_accepted_tokens for o in outs) == totals.accepted_tokens


@pytest.mark.parametrize("seed", [11, None])
def test_sampled_drafts_share_the_targets_noise(tiny_model_dir, seed: int | None) -> None:
    """The target as its own draft, sampling at temperature 1: the draft draws each position
    with the noise the target will use there (the request's seed, or one the engine drew for
    it), so it draws what the target draws and every draft is accepted. An independent draw
    would match only as often as two samples of the model agree."""
    model_dir = tiny_model_dir("llama")
    spec = LLM(model_dir, speculative="draft", speculative_model=str(model_dir),
               num_speculative_tokens=3, num_kv_blocks=128)  # fmt: skip
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True)
    spec.generate(_prompts(), params)
    totals = spec.engine.step_totals
    assert totals.draft_tokens > 0 and totals.accepted_tokens == totals.draft_tokens


@pytest.mark.parametrize(
    "params",
    [
        GREEDY,
        SamplingParams(max_tokens=24, temperature=1.0, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=0.8, top_k=5, seed=3, repetition_penalty=1.3,
                       min_tokens=12, logprobs=2),
    ],
    ids=["greedy", "seeded", "penalties-min-tokens-logprobs"],
)  # fmt: skip
def test_another_draft_changes_no_token(tiny_model_dir, params: SamplingParams) -> None:
    """A draft that is often wrong: some drafts accepted, some rejected, and the output is
    plain decoding's, batched together, requests of different lengths."""
    model_dir = tiny_model_dir("llama")
    plain = LLM(model_dir, num_kv_blocks=128).generate(_prompts(), params)
    spec = LLM(model_dir, speculative="draft", speculative_model=str(_draft(tiny_model_dir)),
               num_speculative_tokens=4, num_kv_blocks=128)  # fmt: skip
    for a, b in zip(plain, spec.generate(_prompts(), params), strict=True):
        assert list(b.token_ids) == list(a.token_ids)
        assert b.finish_reason == a.finish_reason
        if params.logprobs:
            for x, y in zip(a.logprobs, b.logprobs, strict=True):
                assert y.token_id == x.token_id
                assert y.logprob == pytest.approx(x.logprob, abs=1e-4)
    assert spec.engine.step_totals.draft_tokens > 0


def test_draft_slots_are_reused_across_more_requests_than_slots(tiny_model_dir) -> None:
    """More requests over time than the draft has cache slots: finished requests' slots are
    taken over (least recently used first) and a new owner's cache starts afresh."""
    model_dir = tiny_model_dir("llama")
    spec = LLM(model_dir, speculative="draft", speculative_model=str(model_dir),
               num_speculative_tokens=2, num_kv_blocks=256)  # fmt: skip
    draft = spec.engine.scheduler.speculator.draft_model
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(20 + i)] for i in range(draft.max_seqs + 6)]
    for i in range(0, len(prompts), 4):
        for prompt, out in zip(prompts[i : i + 4], spec.generate(prompts[i : i + 4], params)):
            assert list(out.token_ids) == oracle.hf_greedy(str(model_dir), tuple(prompt), 8)
    assert len(draft._slots) == draft.max_seqs
    totals = spec.engine.step_totals
    assert totals.accepted_tokens == totals.draft_tokens > 0


def test_a_request_joining_while_others_draft(tiny_model_dir) -> None:
    """One forward of the draft holds requests catching up by a token or two (decode rows)
    and a new request's whole context (a prefill chunk); all greedy drafts still hold."""
    model_dir = tiny_model_dir("llama")
    llm = LLM(model_dir, speculative="draft", speculative_model=str(model_dir),
              num_speculative_tokens=2, num_kv_blocks=128)  # fmt: skip
    engine, prompts = llm.engine, _prompts()
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
        for _ in range(3):  # the others draft and verify before the next one arrives
            for delta in engine.step():
                tokens[delta.request_id].extend(delta.new_token_ids)
    while engine.has_unfinished():
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.new_token_ids)
    for i, prompt in enumerate(prompts):
        assert tokens[str(i)] == oracle.hf_greedy(str(model_dir), tuple(prompt), 24)
    totals = engine.step_totals
    assert totals.draft_tokens > 0 and totals.accepted_tokens == totals.draft_tokens


def test_a_context_past_the_drafts_positions_decodes_without_drafts(tiny_model_dir) -> None:
    model_dir = tiny_model_dir("llama")
    draft = tiny_model_dir("llama", num_hidden_layers=2, max_position_embeddings=48)
    spec = LLM(model_dir, speculative="draft", speculative_model=str(draft),
               num_speculative_tokens=4, num_kv_blocks=128)  # fmt: skip
    prompt = list(range(100, 150))  # 50 tokens: already past the draft's 48 positions
    out = spec.generate([prompt], GREEDY)[0]
    assert list(out.token_ids) == oracle.hf_greedy(str(model_dir), tuple(prompt), 24)
    assert spec.engine.step_totals.draft_tokens == 0


def test_bad_draft_settings_are_refused(tiny_model_dir) -> None:
    with pytest.raises(ValueError, match="speculative_model"):
        EngineConfig(speculative="draft")
    with pytest.raises(ValueError, match="speculative_model"):
        EngineConfig(speculative="ngram", speculative_model="/some/draft")
    other_vocab = tiny_model_dir("llama", vocab_size=512)
    with pytest.raises(ValueError, match="vocab_size 512 differs"):
        LLM(tiny_model_dir("llama"), speculative="draft", speculative_model=str(other_vocab),
            num_kv_blocks=64)  # fmt: skip


def test_serve_refuses_a_draft_method_without_its_model(tiny_model_dir) -> None:
    from router.cli.main import build_parser
    from router.cli.serve import build_spec

    serve = ["serve", "--device", "cpu", "--speculative", "draft"]
    args = build_parser().parse_args(serve)
    with pytest.raises(SystemExit, match="--speculative-model"):
        build_spec(args, tiny_model_dir("llama"))
    args = build_parser().parse_args([*serve, "--speculative-model", "/no/such/dir"])
    with pytest.raises(SystemExit, match="no config"):
        build_spec(args, tiny_model_dir("llama"))


def test_the_room_left_for_a_draft_is_what_it_takes(tiny_model_dir) -> None:
    """A GPU worker sizes its KV cache before its draft loads (engine/memory_profile.py):
    the bytes it sets aside are the draft's weights and cache, as built."""
    from engine.spec.draft_model import draft_device_bytes
    from engine.spec.speculator import MAX_BATCH

    model_dir = tiny_model_dir("llama")
    llm = LLM(model_dir, speculative="draft", speculative_model=str(_draft(tiny_model_dir)),
              num_speculative_tokens=2, num_kv_blocks=128)  # fmt: skip
    draft = llm.engine.scheduler.speculator.draft_model
    held = sum(p.numel() * p.element_size() for p in draft.model.parameters())
    held += draft.kv_cache.numel() * draft.kv_cache.element_size()
    dtype = next(draft.model.parameters()).dtype
    want = draft_device_bytes(str(_draft(tiny_model_dir)), dtype, MAX_BATCH, draft.max_len)
    assert want == held
