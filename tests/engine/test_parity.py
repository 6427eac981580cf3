"""Greedy output equals Hugging Face `transformers` token for token, through every engine
path: batching, prefix caching on and off, chunked prefill, preemption, and the
prefill -> hand-off -> decode roles."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from core.request import RequestOutput
from core.sampling import SamplingParams
from engine import LLM
from engine.completion import run_to_completion
from engine.engine import LLMEngine
from tests import oracle
from tests.support.handoff import ParkingConnector, copy_kv

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
# Mixed lengths around block boundaries (block size 16), some sharing a 40-token prefix.
LENGTHS = [1, 3, 7, 15, 16, 17, 31, 33, 48, 63, 64, 65, 90, 100, 120, 129]


def make_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab_size) for _ in range(40)]
    prompts = []
    for i, n in enumerate(LENGTHS):
        own = [rng.randrange(3, vocab_size) for _ in range(n)]
        prompts.append((shared + own)[:n] if i % 2 == 0 and n > 40 else own)
    return prompts


def hf_greedy(model_dir: str, prompt: tuple[int, ...]) -> list[int]:
    return oracle.hf_greedy(model_dir, prompt, MAX_TOKENS)


def check_parity(llm: LLM, model_dir: Path, prompts: list[list[int]]) -> None:
    outs = llm.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(str(model_dir), tuple(prompt)), (
            f"prompt len {len(prompt)}"
        )
    assert not llm.engine.has_unfinished()
    llm.engine.check_invariants()
    assert llm.engine.kv.pool.num_used_blocks == 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_batches_with_prefix_cache(tiny_model_dir, arch: str, batch: int) -> None:
    model_dir = tiny_model_dir(arch)
    llm = LLM(model_dir, num_kv_blocks=512)
    prompts = make_prompts(llm.engine.model_config.vocab_size)[:batch]
    check_parity(llm, model_dir, prompts)
    # Again: now most prompt blocks come from the prefix cache.
    check_parity(llm, model_dir, prompts)
    if batch == 16:
        assert llm.generate(prompts[-1:], GREEDY)[0].num_cached_tokens > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_cache_off(tiny_model_dir, arch: str) -> None:
    model_dir = tiny_model_dir(arch)
    llm = LLM(model_dir, num_kv_blocks=512, enable_prefix_caching=False)
    prompts = make_prompts(llm.engine.model_config.vocab_size)
    check_parity(llm, model_dir, prompts)
    assert all(o.num_cached_tokens == 0 for o in llm.generate(prompts[:4], GREEDY))


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill(tiny_model_dir, arch: str) -> None:
    model_dir = tiny_model_dir(arch)
    # A budget of 7 tokens chunks every prompt longer than that, in odd-sized pieces.
    llm = LLM(model_dir, num_kv_blocks=512, max_num_batched_tokens=7)
    check_parity(llm, model_dir, make_prompts(llm.engine.model_config.vocab_size))


@pytest.mark.parametrize("arch", ARCHS)
def test_preemption(tiny_model_dir, arch: str) -> None:
    model_dir = tiny_model_dir(arch)
    # 14 blocks of 16 tokens: the longest prompt alone needs 9 with its output, so running
    # requests must be preempted and recomputed.
    llm = LLM(model_dir, num_kv_blocks=14)
    prompts = make_prompts(llm.engine.model_config.vocab_size)
    check_parity(llm, model_dir, prompts)
    assert llm.engine.scheduler.num_preemptions > 0


def hand_off(
    prefill: LLMEngine, decode: LLMEngine, prompts: list[list[int]]
) -> dict[str, list[int]]:
    """Prefill (its connector parks every prompt) -> in-process KV copy -> decode, for a
    batch of prompts."""
    connector = prefill.kv_connector
    assert isinstance(connector, ParkingConnector)
    bs = prefill.config.block_size
    reservations = {}
    for i, p in enumerate(prompts):
        rid = f"r{i}"
        reservations[rid] = decode.reserve(decode.prepare(rid, p, GREEDY))
        prefill.add_request(rid, p, GREEDY)
    results: dict[str, list[int]] = {}
    admitted: dict[str, RequestOutput] = {}
    while prefill.has_unfinished():
        prefill.step()
        for res in connector.take():
            r = reservations[res.request_id]
            if res.output.finished:  # the first token already ended it
                decode.abort(res.request_id)
                prefill.release(res.request_id)
                results[res.request_id] = res.output.new_token_ids
                continue
            skip = r.num_cached_tokens // bs  # blocks the decode engine already holds
            copy_kv(prefill, decode, res.block_ids[skip:], r.block_ids[skip:])
            prefill.release(res.request_id)
            first = decode.admit(res.request_id, res.first_token, res.logprob)
            admitted[res.request_id] = RequestOutput(res.request_id, []).add(first)
    for rid, out in run_to_completion(decode, {}).items():
        admitted[rid].token_ids += out.token_ids
    for rid, out in admitted.items():
        results[rid] = out.token_ids
    return results


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prefill_handoff_decode_equals_unified(tiny_model_dir, arch: str) -> None:
    model_dir = tiny_model_dir(arch)
    from core.config import EngineConfig

    prefill = LLMEngine(model_dir, EngineConfig(num_kv_blocks=256))
    ParkingConnector(prefill)
    decode = LLMEngine(model_dir, EngineConfig(num_kv_blocks=256), worker_id="d")
    prompts = make_prompts(prefill.model_config.vocab_size)
    got = hand_off(prefill, decode, prompts)
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == hf_greedy(str(model_dir), tuple(p)), f"prompt len {len(p)}"
    # Second round: the decode engine now holds prompt prefixes, so less is sent, same tokens.
    got = hand_off(prefill, decode, prompts)
    for i, p in enumerate(prompts):
        assert got[f"r{i}"] == hf_greedy(str(model_dir), tuple(p))
    for engine in (prefill, decode):
        engine.check_invariants()
        assert engine.kv.pool.num_used_blocks == 0
