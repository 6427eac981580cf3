"""The engine's public behaviour beyond greedy parity: errors, seeds, stops, events, abort."""

from __future__ import annotations

import pytest

from core.events import AllBlocksCleared, BlockRemoved, BlockStored
from core.request import FinishReason
from core.sampling import SamplingParams
from engine import LLM
from engine.completion import run_to_completion
from engine.config import ModelConfigError
from engine.engine import LLMEngine


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:
    return LLM(tiny_model_dir("llama"), num_kv_blocks=128)


def prompt(n: int, start: int = 10) -> list[int]:
    return [start + i % 500 for i in range(n)]


def test_bad_inputs_are_clear_errors_and_engine_keeps_serving(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request("ok", prompt(20), SamplingParams(max_tokens=4, temperature=0))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("e1", [], SamplingParams())
    with pytest.raises(ValueError, match="context holds"):
        engine.add_request("e2", prompt(engine.max_model_len), SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("e3", [10**7], SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("ok", prompt(3), SamplingParams())
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    outs = run_to_completion(engine, {})
    assert list(outs) == ["ok"] and outs["ok"].finished and len(outs["ok"].token_ids) == 4
    engine.check_invariants()


def test_unknown_architecture_and_missing_folder(tmp_path, tiny_model_dir) -> None:
    import json
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir("llama"), bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="GPT2LMHeadModel"):
        LLMEngine(bad)
    with pytest.raises(ModelConfigError, match=r"does not exist"):
        LLMEngine(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelConfigError, match=r"config\.json"):
        LLMEngine(tmp_path / "empty")


def test_seeded_sampling_same_alone_or_in_batch(llm: LLM) -> None:
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=1234)
    alone = llm.generate([prompt(30)], params)[0].token_ids
    others = [
        SamplingParams(max_tokens=10, temperature=0.8),
        SamplingParams(max_tokens=10, temperature=0.0),
        SamplingParams(max_tokens=10, temperature=1.3, seed=7),
    ]
    outs = llm.generate(
        [prompt(5, 50), prompt(40, 90), prompt(30), prompt(12, 7)],
        [others[0], others[1], params, others[2]],
    )
    assert outs[2].token_ids == alone
    assert llm.generate([prompt(30)], params)[0].token_ids == alone


def test_stop_string_is_cut_from_text(llm: LLM) -> None:
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    full = llm.generate([prompt(25)], greedy)[0]
    assert len(full.text) > 6
    stop = full.text[4:7]
    out = llm.generate(
        [prompt(25)], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    )[0]
    assert out.finish_reason == FinishReason.STOP and out.stop_reason == stop
    assert stop not in out.text and full.text.startswith(out.text)


def test_stop_token_ids_and_max_tokens(llm: LLM) -> None:
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    full = llm.generate([prompt(9)], greedy)[0]
    assert full.finish_reason == FinishReason.LENGTH and len(full.token_ids) == 8
    target = full.token_ids[3]
    out = llm.generate(
        [prompt(9)],
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=[target]),
    )[0]
    assert out.finish_reason == FinishReason.STOP and out.stop_reason == target
    assert out.token_ids[-1] == target and len(out.token_ids) <= 4


def test_logprobs_and_timings(llm: LLM) -> None:
    out = llm.generate([prompt(17)], SamplingParams(max_tokens=3, temperature=0, logprobs=3))[0]
    assert out.logprobs is not None and len(out.logprobs) == 3
    for tok, lp in zip(out.token_ids, out.logprobs, strict=True):
        assert lp.token_id == tok and len(lp.top) == 3 and lp.top[0][0] == tok
    t = out.timings
    assert t.queued_s is not None and t.prefill_s is not None and t.decode_s is not None
    assert t.queued_s >= 0 and t.prefill_s >= 0 and t.decode_s >= 0


def test_abort_frees_blocks(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request("a", prompt(40), SamplingParams(max_tokens=50))
    engine.step()
    assert engine.kv.pool.num_used_blocks > 0
    assert engine.abort("a") and not engine.abort("a")
    assert engine.kv.pool.num_used_blocks == 0 and not engine.has_unfinished()
    engine.check_invariants()


def test_kv_events_describe_the_cache(tiny_model_dir) -> None:
    from core.config import EngineConfig

    engine = LLMEngine(tiny_model_dir("llama"), EngineConfig(num_kv_blocks=6), worker_id="w0")
    engine.add_request("a", prompt(40), SamplingParams(max_tokens=1))
    while engine.has_unfinished():
        engine.step()
    batch = engine.take_kv_events()
    assert batch is not None and batch.worker_id == "w0" and batch.seq == 0
    assert isinstance(batch.events[0], AllBlocksCleared)
    stored = [e for e in batch.events if isinstance(e, BlockStored)]
    assert stored and stored[0].parent is None and len(stored[0].block_hashes) == 2
    # Filling the small pool with another prompt evicts them: `removed` events follow.
    engine.add_request("b", prompt(80, 300), SamplingParams(max_tokens=1))
    while engine.has_unfinished():
        engine.step()
    batch2 = engine.take_kv_events()
    assert batch2 is not None and batch2.seq == 1
    assert any(isinstance(e, BlockRemoved) for e in batch2.events)
    load = engine.load()
    assert load.num_total_blocks == 6 and load.num_running == 0


def test_final_text_equals_a_full_decode(llm: LLM) -> None:
    # Random weights emit byte tokens that end mid-character: the finished text must still be
    # exactly what decoding all output tokens gives.
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = llm.generate([prompt(n, 20 + 7 * n) for n in range(5, 60, 6)], params)
    for out in outs:
        assert out.text == llm.tokenizer.decode(out.token_ids)


def test_chat_prompts_with_the_tokenizers_chat_ids(llm: LLM) -> None:
    messages = [{"role": "user", "content": "Hi there!"}]
    out = llm.chat(messages, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert out.prompt_token_ids == llm.tokenizer.encode_chat(messages)
    assert out.finished and len(out.token_ids) == 3
