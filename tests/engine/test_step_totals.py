"""The engine's step totals (reported with its load): counts that add up, phases that nest."""

from __future__ import annotations

from core.config import EngineConfig
from core.sampling import SamplingParams
from engine.engine import LLMEngine


def test_step_totals_count_rows_and_tokens(tiny_model_dir) -> None:
    engine = LLMEngine(tiny_model_dir(), EngineConfig(num_kv_blocks=64))
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    prompts = [list(range(5, 25)), list(range(30, 42))]
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    t = engine.load().steps
    assert t.steps == steps
    assert t.prefill_tokens == sum(len(p) for p in prompts)
    assert t.decode_rows == len(prompts) * (params.max_tokens - 1)  # the first comes with prefill
    assert 0 < t.attention_s < t.forward_s  # on CPU attention is timed, inside the forward
    assert t.sample_s > 0 and t.output_s > 0 and t.schedule_s > 0
