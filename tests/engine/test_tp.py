"""Tensor parallelism: TP=2 over gloo on CPU (two rank processes) gives the same greedy
tokens as TP=1 and as transformers, including a model whose single KV head is replicated."""

from __future__ import annotations

import os

import pytest

from core.config import EngineConfig
from core.sampling import SamplingParams
from engine import LLM
from engine.tp import TPEngine
from tests.engine.test_parity import GREEDY, hf_greedy, make_prompts

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

# Lengths 1, 17 (block boundary + 1) and 65 (sharing a 40-token prefix with others).
PROMPT_IDS = [0, 5, 11]
SEEDED = SamplingParams(max_tokens=6, temperature=1.0, seed=7)
TP_CONFIG = dict(num_kv_blocks=128, num_threads=1, max_num_batched_tokens=64)


def check_tp2(model_dir) -> None:
    single = LLM(model_dir, **TP_CONFIG)
    prompts = [make_prompts(single.engine.model_config.vocab_size)[i] for i in PROMPT_IDS]
    want = [hf_greedy(str(model_dir), tuple(p)) for p in prompts]
    assert [o.token_ids for o in single.generate(prompts, GREEDY)] == want
    # Random sampling stays in lockstep too: every rank draws from the same generator state.
    want_sampled = [o.token_ids for o in single.generate(prompts, SEEDED)]
    with TPEngine(model_dir, EngineConfig(tp_size=2, **TP_CONFIG)) as engine:
        # A refusal raised on every rank leaves the engine usable.
        with pytest.raises(ValueError, match="empty"):
            engine.add_request("bad", [], GREEDY)
        assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == want
        # Again: the prompts' blocks now come from each rank's prefix cache.
        outs = engine.generate(prompts, GREEDY)
        assert [o.token_ids for o in outs] == want
        assert any(o.num_cached_tokens > 0 for o in outs)
        assert [o.token_ids for o in engine.generate(prompts, SEEDED)] == want_sampled
        engine.check_invariants()
        assert not engine.has_unfinished()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tp2_matches_tp1_and_transformers(tiny_model_dir, arch: str) -> None:
    check_tp2(tiny_model_dir(arch))


def test_tp2_ranks_overlap_their_steps_in_step(tiny_model_dir) -> None:
    """Each rank launches a step before the last one's tokens are processed (engine/
    overlap.py): the same decisions on every rank, the collectives lined up, TP=1's tokens."""
    model_dir = tiny_model_dir("llama")
    single = LLM(model_dir, **TP_CONFIG)
    prompts = [make_prompts(single.engine.model_config.vocab_size)[i] for i in PROMPT_IDS]
    want = [o.token_ids for o in single.generate(prompts, GREEDY)]
    want_sampled = [o.token_ids for o in single.generate(prompts, SEEDED)]
    with TPEngine(model_dir, EngineConfig(tp_size=2, overlap_steps=True, **TP_CONFIG)) as engine:
        assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == want
        assert [o.token_ids for o in engine.generate(prompts, SEEDED)] == want_sampled
        assert engine.load().steps.overlapped_steps > 0
        engine.check_invariants()
        assert not engine.has_unfinished()


def test_tp2_replicates_a_single_kv_head(tiny_model_dir) -> None:
    check_tp2(tiny_model_dir("llama", num_key_value_heads=1))


def test_tp_size_the_model_cannot_split_is_refused_before_start(tiny_model_dir) -> None:
    with pytest.raises(ValueError, match="tp_size=3"):
        TPEngine(tiny_model_dir("llama"), EngineConfig(tp_size=3))
