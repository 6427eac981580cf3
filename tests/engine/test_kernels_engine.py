"""End to end through the Triton kernels (under the interpreter): the tiny model's greedy
output equals transformers', across chunked prefill, mixed decode + prefill steps and a
prefix-cache hit (an extend over cached blocks); and through the decode-graph buffers."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

from core.config import EngineConfig
from engine import LLM
from engine.completion import run_to_completion
from engine.engine import LLMEngine
from tests.engine.test_parity import GREEDY, hf_greedy, make_prompts
from tests.support.graph_capturer import CountingCapturer


def test_triton_path_matches_transformers(tiny_model_dir, monkeypatch) -> None:
    monkeypatch.setenv("BATON_ATTENTION", "triton")
    model_dir = tiny_model_dir("llama")
    # A 24-token budget chunks the 33-token prompt and mixes it with the others' decodes.
    llm = LLM(model_dir, num_kv_blocks=64, max_num_batched_tokens=24)
    backend = llm.engine.runner.model.model.layers[0].self_attn.backend
    assert backend.name == "triton" and backend.fuses_rotary  # rotary in the KV write's kernel
    prompts = [make_prompts(llm.engine.model_config.vocab_size)[i] for i in (4, 7)]
    want = [hf_greedy(str(model_dir), tuple(p)) for p in prompts]
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == want
    # The same prompts again start from cached blocks: the extend path over a prefix.
    outs = llm.generate(prompts[1:], GREEDY)
    assert outs[0].token_ids == want[1] and outs[0].num_cached_tokens > 0


def test_triton_decode_graphs_match_transformers(tiny_model_dir, monkeypatch) -> None:
    # The static-buffer decode path (engine/cuda_graphs.py, replayed by re-running it) through
    # the Triton kernels: 3 decodes padded to 4, fixed-width tables, the step's workspace.
    monkeypatch.setenv("BATON_ATTENTION", "triton")
    model_dir = tiny_model_dir("llama")
    config = EngineConfig(num_kv_blocks=64, max_num_seqs=4, num_threads=1)
    capturer = CountingCapturer()
    engine = LLMEngine(model_dir, config, capturer=capturer)
    prompts = [make_prompts(engine.model_config.vocab_size)[i] for i in (1, 2, 5)]
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, GREEDY)
    outs = run_to_completion(engine, {str(i): p for i, p in enumerate(prompts)})
    want = [hf_greedy(str(model_dir), tuple(p)) for p in prompts]
    assert [outs[str(i)].token_ids for i in range(3)] == want
    assert capturer.by_size(engine)[4] > 0
