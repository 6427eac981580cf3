"""Prompt logprobs equal Hugging Face's log-softmax at every prompt position, through chunked
prefill and past a warm prefix cache (which such a request does not read: a cached block has
no logits); they come once, on the first output, and only to the request that asked."""

from __future__ import annotations

import pytest
import torch

from core.sampling import SamplingParams
from engine.llm import LLM
from tests import oracle

PROMPT = [7 + (i * 37) % 400 for i in range(70)]


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:  # type: ignore[no-untyped-def]
    # A 16-token step budget: the 70-token prompt runs in 5 chunks.
    return LLM(tiny_model_dir("llama"), num_kv_blocks=64, max_num_batched_tokens=16)


def test_prompt_logprobs_equal_the_oracle_through_chunks_and_a_warm_cache(llm: LLM) -> None:
    model_dir = str(llm.engine.model_config.model_dir)
    warm = llm.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0))[0]
    assert warm.prompt_logprobs is None
    params = [
        SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=4),
        SamplingParams(max_tokens=3, temperature=0),
    ]
    asked, plain = llm.generate([PROMPT, PROMPT[:30]], params)
    assert plain.prompt_logprobs is None
    assert asked.num_cached_tokens == 0  # computed in full, cache or not
    assert asked.token_ids[:2] == warm.token_ids
    expected = oracle.hf_prompt_logprobs(model_dir, tuple(PROMPT))
    got = asked.prompt_logprobs
    assert got is not None and len(got) == len(PROMPT) and got[0] is None
    for position, lp in enumerate(got[1:], start=1):
        row = expected[position - 1]
        assert lp is not None and lp.token_id == PROMPT[position]
        assert lp.logprob == pytest.approx(row[PROMPT[position]].item(), abs=1e-4)
        assert lp.rank == int((row > row[PROMPT[position]]).sum()) + 1
        values, ids = row.topk(4)
        assert [t for t, _ in lp.top] == ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in lp.top]), values, atol=1e-4)


def test_zero_alternatives_and_a_one_token_prompt(llm: LLM) -> None:
    out = llm.generate(
        [PROMPT[:20], PROMPT[:1]],
        SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0),
    )
    assert out[0].prompt_logprobs is not None
    assert all(lp is not None and lp.top == () for lp in out[0].prompt_logprobs[1:])
    assert out[1].prompt_logprobs == [None]
