"""Requests of every kind of sampling, run to their end on an engine with some of them
arriving mid-run: what overlapped steps are checked against one step at a time with
(tests/engine/test_overlap.py, tests/gpu/test_engine.py)."""

from __future__ import annotations

from core.request import RequestOutput
from core.sampling import SamplingParams
from core.structured import StructuredKind, StructuredOutput
from engine.engine import LLMEngine


def mixed_params() -> list[SamplingParams]:
    digits = StructuredOutput(StructuredKind.REGEX, "[0-9]{2,6}")
    return [
        SamplingParams(max_tokens=1, temperature=0.0),
        SamplingParams(max_tokens=2, temperature=0.0),
        SamplingParams(max_tokens=17, temperature=0.0, logprobs=3),
        SamplingParams(max_tokens=20, temperature=0.9, top_k=20, seed=7),
        SamplingParams(max_tokens=20, temperature=0.7, top_p=0.8, seed=8, min_tokens=12),
        SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=[5, 9, 11, 13]),
        SamplingParams(max_tokens=16, temperature=0.0, stop=["e", "a"]),
        SamplingParams(max_tokens=12, temperature=1.0, seed=3, repetition_penalty=1.4),
        SamplingParams(max_tokens=10, temperature=0.0, structured_outputs=digits),
    ]


def run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams], tag: str):
    """Every request to its end, the later half arriving while the first half runs."""
    outs = {f"{tag}{i}": RequestOutput(f"{tag}{i}", p) for i, p in enumerate(prompts)}
    items = list(zip(outs, prompts, params, strict=True))
    half = len(items) // 2
    for rid, prompt, sp in items[:half]:
        engine.add_request(rid, prompt, sp)
    steps = 0
    while engine.has_unfinished():
        for delta in engine.step():
            outs[delta.request_id].add(delta)
        steps += 1
        if steps == 3:
            for rid, prompt, sp in items[half:]:
                engine.add_request(rid, prompt, sp)
    engine.check_invariants()
    assert engine.kv.pool.num_used_blocks == 0
    return {rid.removeprefix(tag): out for rid, out in outs.items()}
